"""The shared pieces of the tables for people, in a terminal and in a notebook: short headers and their legend,
number formats, colour scales, columns fitted to the width (`Column`, `fit_tables`), the per-head table, the model
line and dim notes. Each subject's table is built from them in `terminal/<subject>.py` (the analysis's in
`terminal/analysis.py`, the sweep's in `terminal/sweep.py`). Pure presentation: every number comes from the records;
library code, so a result renders itself without the CLI (which only prints these).

Tables fit the terminal without cutting a number: columns get short headers (`sym`, `erank`, `ovl_qk` …) with a
legend line below (JSON and CSV keep the full names), columns that carry nothing are dropped (`kv` when it equals
`head`, `block` when there is one block), and metric columns that still do not fit go to a second table that repeats
the row labels. Colours are the 16 standard ones, in steps that follow the value (dim, plain, colour, bold colour),
so a 16-colour terminal shows the same order as a true-colour one.

Example:
    >>> print(short_name("symmetry_median"))
    sym_med
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

# Column headers in tables (the legend line under a table spells them out; JSON and CSV use the full names).
SHORT_NAMES = {
    "symmetry": "sym", "directionality": "dir", "qk_effective_rank": "erank", "qk_stable_rank": "srank",
    "qk_participation_ratio": "pratio", "qk_k90": "k90", "qk_eig_pos_frac": "eig_pos", "qk_eig_real_ratio": "eig_re",
    "shared_qk_distance": "shared", "overlap_qk": "ovl_qk", "overlap_qv": "ovl_qv", "overlap_kv": "ovl_kv",
    "cosine_qk": "cos_qk", "cosine_qv": "cos_qv", "cosine_kv": "cos_kv",
    "norm_q_fro": "q_fro", "norm_k_fro": "k_fro", "norm_v_fro": "v_fro", "norm_qk_fro": "qk_fro",
    "norm_q_spec": "q_spec", "norm_k_spec": "k_spec", "norm_v_spec": "v_spec", "norm_qk_spec": "qk_spec",
    "bias_q_norm": "bq", "bias_k_norm": "bk", "bias_v_norm": "bv",
    "ov_effective_rank": "ov_erank", "ov_copying": "ov_copy", "ov_norm_spec": "ov_spec",
    "symmetry_layer": "sym_sum", "directionality_layer": "dir_sum",
}
_SUFFIXES = {"_median": "_med", "_mean": "_mean"}
COLUMN_GAP = 2  # two spaces between columns: no vertical rules, one space of padding on the right


def short_name(metric: str) -> str:
    """The table header for `metric`: `symmetry` -> `sym`, `delta_symmetry` -> `Δsym`, `symmetry_median` ->
    `sym_med`; a name without a short form is kept whole."""
    if metric.startswith("delta_"):
        return "Δ" + short_name(metric.removeprefix("delta_"))
    if metric in SHORT_NAMES:
        return SHORT_NAMES[metric]
    for suffix, short in _SUFFIXES.items():
        if metric.endswith(suffix) and metric.removesuffix(suffix) in SHORT_NAMES:
            return SHORT_NAMES[metric.removesuffix(suffix)] + short
    return metric


def basis_dependent(names: Iterable[str]) -> list[str]:
    """The metrics among `names` that are not invariant under the full gauge freedom (registry's gauge_invariant)."""
    from qkinspect.metrics.registry import METRICS

    return [n for n in names if n in METRICS and METRICS[n].gauge_invariant != "yes"]


def fmt_value(v: Any, digits: int = 3) -> str:
    """A table cell: '-' for a missing value, integers as integers, else `digits` decimals (4 significant digits
    from 1000 up)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    v = float(v)
    if abs(v) >= 1000:
        return f"{v:.4g}"
    return f"{v:.{digits}f}"


def fmt_spec(v: Any, spec: str = ".4f") -> str:
    """A cell in the format `spec` (`"+.4f"`, `"d"` …), '-' for a missing value."""
    return "-" if v is None else format(v, spec)


def scale_style(metric: str, v: Any) -> str:
    """Colour by value, in steps of the 16 standard colours so every terminal shows the same order: symmetry-like
    scores diverge around 0 (blue below, red above; plain near 0, bold beyond ±0.4); overlaps and similarities
    grow over [0, 1] from dim through plain and green to bold green; others are plain. NaN is dim."""
    if v is None or not isinstance(v, (int, float)) or math.isnan(v):
        return "dim"
    name = metric.removeprefix("delta_")
    if name.startswith(("symmetry", "directionality")):
        return _diverging(float(v))
    if name.startswith(("overlap", "cka")):
        return _sequential(abs(float(v)))
    return ""


def _diverging(x: float) -> str:
    if abs(x) < 0.1:
        return ""
    hue = "red" if x > 0 else "blue"
    return f"bold {hue}" if abs(x) >= 0.4 else hue


def _sequential(x: float) -> str:
    steps = ((0.2, "dim"), (0.4, ""), (0.7, "green"))
    return next((style for top, style in steps if x < top), "bold green")


@dataclass
class Column:
    """One table column: its header and its cells (str or rich Text), right-aligned unless `left`."""

    header: str
    cells: list[Any] = field(default_factory=list)
    left: bool = False

    def width(self) -> int:
        from rich.cells import cell_len

        texts = [c if isinstance(c, str) else c.plain for c in self.cells]
        return max([cell_len(self.header), *(cell_len(t) for t in texts)])


def fit_tables(labels: Sequence[Column], values: Sequence[Column], *, width: int, sections: Sequence[int] = (),
               title: str | None = None) -> list:
    """Tables holding every column whole: the label columns, then as many value columns as fit `width`; the rest
    go to further tables that repeat the labels. `sections`: row indices that start a new group (a rule above).

    A table of n columns prints sum(widths) + COLUMN_GAP·(n − 1) characters: a gap between columns, none after the
    last. Counting a gap after every column, the room is `width + COLUMN_GAP`, so a table exactly `width` wide is
    one table."""
    used = sum(c.width() for c in labels) + COLUMN_GAP * len(labels)  # each label column and the gap after it
    groups: list[list[Column]] = [[]]
    room = width + COLUMN_GAP - used
    for col in values:
        need = col.width() + COLUMN_GAP
        if groups[-1] and need > room:
            groups.append([])
            room = width + COLUMN_GAP - used
        groups[-1].append(col)
        room -= need
    if not labels and not values:
        return []
    return [_table([*labels, *cols], sections, title if i == 0 else f"{title}, continued" if title else "continued")
            for i, cols in enumerate(groups)]


def _table(columns: Sequence[Column], sections: Sequence[int], title: str | None):
    """A rich Table, under its title as a line of its own (rich would wrap a title to a narrow table's width)."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    t = Table(header_style="bold", show_edge=False, pad_edge=False, box=box.SIMPLE_HEAVY, padding=(0, 1, 0, 0))
    for c in columns:
        t.add_column(c.header, justify="left" if c.left else "right", no_wrap=True, overflow="fold",
                     min_width=c.width())
    starts = set(sections)
    n_rows = len(columns[0].cells) if columns else 0
    for i in range(n_rows):
        if i in starts and i > 0:
            t.add_section()
        t.add_row(*[c.cells[i] for c in columns])
    return Group(Text(title, style="italic"), t) if title else t


def legend(columns: Iterable[str], marked: Iterable[str] = ()) -> str:
    """'columns: sym=symmetry, erank=qk_effective_rank, …' for the headers that differ from their names."""
    marked = set(marked)
    pairs = [f"{short_name(c)}{'*' if c in marked else ''}={c}" for c in columns if short_name(c) != c]
    return "columns: " + ", ".join(pairs) if pairs else ""


def head_table(heads: Iterable, columns: Sequence[str], *, grouped: bool = True, title: str | None = None,
               width: int = 80) -> list:
    """Per-head tables, one row per head; with `grouped`, a rule between layers (rows arrive in block, layer, head
    order). `block` is shown only when the rows span several blocks, `kv` only when some head's key/value head
    differs from its own index (grouped-query attention)."""
    heads = list(heads)
    marked = set(basis_dependent(c.removeprefix("delta_") for c in columns))
    labels = [Column("block", [h.block for h in heads], left=True), Column("layer", [str(h.layer) for h in heads]),
              Column("head", [str(h.head) for h in heads]), Column("kv", [str(h.kv_head) for h in heads])]
    if len({h.block for h in heads}) <= 1:
        labels[0] = None
    if all(h.kv_head == h.head for h in heads):
        labels[3] = None
    empty = set(empty_columns(heads, columns))
    values = [Column(short_name(c) + ("*" if c.removeprefix("delta_") in marked else ""),
                     [cell(c, h.values.get(c)) for h in heads]) for c in columns if c not in empty]
    sections = [i for i in range(1, len(heads)) if (heads[i].block, heads[i].layer)
                != (heads[i - 1].block, heads[i - 1].layer)] if grouped else []
    return fit_tables([c for c in labels if c is not None], values, width=width, sections=sections, title=title)


def empty_columns(records: Sequence, columns: Iterable[str]) -> list[str]:
    """The columns with no value in any record (e.g. bias norms of a model without biases): not shown."""
    return [c for c in columns if records and all(fmt_value(r.values.get(c)) == "-" for r in records)]


def cell(metric: str, v: Any):
    from rich.text import Text

    from qkinspect.metrics.registry import INTEGER_METRICS

    if metric in INTEGER_METRICS and isinstance(v, float) and v.is_integer():
        v = int(v)
    return Text(fmt_value(v), style=scale_style(metric, v))


def model_line(info, processing=None) -> str:
    shapes = "; ".join(f"{b.key}: {b.n_layers} layers x {b.n_heads} heads"
                       + (f" ({b.n_kv_heads} KV)" if b.n_kv_heads != b.n_heads else "")
                       + f", d_model {b.d_model}, d_head {b.d_head}, {b.positional}" for b in info.blocks)
    line = f"{info.name} ({info.model_type}) {shapes}"
    if processing is not None:
        flags = [processing.precision, processing.device]
        flags += [name for name in ("fold_ln", "fold_qk_norm", "layer_form") if getattr(processing, name, False)]
        line += f"  [{', '.join(flags)}]"
    return line


def qk_norm_line(blocks: Sequence[str]) -> str:
    """What a raw measurement of blocks with q/k norms is not, and how to get what attention computes."""
    which = f"{', '.join(blocks)} block{'s' if len(blocks) > 1 else ''}"
    return (f"q/k norm not folded ({which}): this is the raw W_Q W_Kᵀ as stored, not what attention computes; "
            "--fold-qk-norm measures W_Q diag(γ_q γ_k) W_Kᵀ")


def gauge_note(console, columns: Iterable[str]) -> None:
    """The footnote for columns marked '*' by `head_table`."""
    marked = basis_dependent(c.removeprefix("delta_") for c in columns)
    if marked:
        console.print(f"* not gauge-invariant (depends on the basis of the head space): {', '.join(marked)}",
                      style="dim", highlight=False)


def print_lines(console, lines: Iterable[str]) -> None:
    """Dim notes under a table, wrapped at word boundaries to the console's width."""
    for line in lines:
        if line:
            console.print(line, style="dim", highlight=False, markup=False)
