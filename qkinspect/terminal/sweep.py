"""`qkinspect sweep`'s table for people: the tidy rows of a sweep (a row per checkpoint, step, block, layer and
head, or per layer) in `analyze`'s tables, a rule between checkpoints."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from qkinspect.terminal.analysis import DEFAULT_COLUMNS, LAYER_COLUMNS, hidden_hint, requested_head_metrics
from qkinspect.terminal.tables import (
    Column,
    basis_dependent,
    cell,
    fit_tables,
    fmt_value,
    legend,
    print_lines,
    short_name,
)


def sweep_tables(rows: Sequence[dict[str, Any]], columns: Sequence[str], *, by: str = "head",
                 width: int = 80) -> tuple[list, list[str]]:
    """A sweep's tidy rows (a dict per checkpoint, step, block, layer and head, or per layer with by="layer") as
    tables like `analyze`'s: the same label and value columns, a rule between checkpoints, metric columns that do not
    fit in further tables. Checkpoint names wider than a quarter of `width` are numbered, the numbers spelt out in
    the returned lines (with the legend of short headers)."""
    names = list(dict.fromkeys(r["checkpoint"] for r in rows))
    numbered = max(map(len, names), default=0) > width // 4
    ids = {n: str(i + 1) for i, n in enumerate(names)}
    labels = [Column("ckpt" if numbered else "checkpoint", [ids[r["checkpoint"]] if numbered else r["checkpoint"]
                                                           for r in rows], left=not numbered),
              Column("step", [str(r["step"]) for r in rows])]
    if len({r.get("block") for r in rows}) > 1:
        labels.append(Column("block", [r["block"] for r in rows], left=True))
    labels.append(Column("layer", [str(r["layer"]) for r in rows]))
    if by == "head":
        labels.append(Column("head", [str(r["head"]) for r in rows]))
        if any(r.get("kv_head") != r["head"] for r in rows):
            labels.append(Column("kv", [str(r.get("kv_head")) for r in rows]))
    else:
        labels.append(Column("heads", [str(r.get("n_heads")) for r in rows]))
    shown = [c for c in columns if any(fmt_value(r.get(c)) != "-" for r in rows)]
    marked = set(basis_dependent(shown)) if by == "head" else set()
    values = [Column(short_name(c) + ("*" if c in marked else ""), [cell(c, r.get(c)) for r in rows]) for c in shown]
    sections = [i for i in range(1, len(rows)) if rows[i]["checkpoint"] != rows[i - 1]["checkpoint"]]
    lines = [legend(shown, marked)]
    if numbered:
        lines.append("checkpoints: " + ", ".join(f"{ids[n]}={n}" for n in names))
    return fit_tables(labels, values, width=width, sections=sections), lines


def render_sweep(console, rows: Sequence[dict[str, Any]], requested=None, by: str = "head") -> None:
    """A row per checkpoint, step, block, layer and head (or per layer with --by layer), in `analyze`'s tables."""
    labels = {"checkpoint", "step", "block", "layer", "head", "kv_head", "n_heads", "rank_q", "rank_k", "rank_v"}
    have = list(dict.fromkeys(k for r in rows for k in r if k not in labels))
    wanted = (requested_head_metrics(requested) if by == "head" else list(requested)) if requested else \
        (DEFAULT_COLUMNS if by == "head" else LAYER_COLUMNS)
    cols = [c for c in wanted if c in have] or have[:8]
    tables, lines = sweep_tables(rows, cols, by=by, width=console.width)
    for t in tables:
        console.print(t)
    print_lines(console, [*lines, hidden_hint(have, cols, by)])
