"""Rich tables for people: per-head metrics grouped by block and layer, colour-scaled symmetry and overlap,
the random baseline, and a per-layer summary. Pure presentation: every number comes from the records.

Example:
    >>> from rich.console import Console
    >>> render_analysis(Console(), result, columns=default_columns(result))
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

# Shown when the user names no metrics: the questions of the README, one column each.
DEFAULT_COLUMNS = ("symmetry", "directionality", "qk_effective_rank", "qk_stable_rank", "overlap_qk", "overlap_qv",
                   "overlap_kv", "ov_copying")
LAYER_COLUMNS = ("symmetry_median", "symmetry_mean", "overlap_qk_median", "qk_effective_rank_median",
                 "symmetry_layer", "directionality_layer")
# the metrics with a random baseline (qkinspect.metrics.baseline, which imports torch: not imported here)
BASELINE_METRICS = ("symmetry", "shared_qk_distance", "overlap_qk", "overlap_qv", "overlap_kv")


def default_columns(result, requested: Sequence[str] | None = None, sort: str | None = None) -> list[str]:
    """The metric columns to show: the requested ones, else the defaults that were computed; plus the sort key."""
    have = list(result.metric_names) or sorted({k for h in result.heads for k in h.values})
    cols = [m for m in (_head_metrics(requested) if requested else DEFAULT_COLUMNS) if m in have] or have[:8]
    if sort and sort in have and sort not in cols:
        cols.append(sort)
    return cols


def _head_metrics(requested: Sequence[str]) -> list[str]:
    """Requested metric and group names ("symmetry,eigen") as the per-head metrics they stand for, in the order
    given; a name the registry does not know is kept as it is (it simply matches no column)."""
    from qkinspect.errors import InputError
    from qkinspect.metrics.registry import METRICS, resolve_metrics

    out: list[str] = []
    for name in requested:
        try:
            names = resolve_metrics([name])
        except InputError:  # not a registry name: left to the caller's own checks
            names = (name,)
        out += [n for n in names if n not in out and (n not in METRICS or METRICS[n].per == "head")]
    return out


def basis_dependent(names: Iterable[str]) -> list[str]:
    """The metrics among `names` that are not invariant under the full gauge freedom (registry's gauge_invariant)."""
    from qkinspect.metrics.registry import METRICS

    return [n for n in names if n in METRICS and METRICS[n].gauge_invariant != "yes"]


def fmt_value(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    v = float(v)
    return f"{v:.{digits}f}" if abs(v) < 1000 else f"{v:.4g}"


def scale_style(metric: str, v: Any) -> str:
    """Colour by value: symmetry-like scores diverge around 0 (blue < 0 < red); overlaps and similarities grow
    from dim to green over [0, 1]; others are plain."""
    if v is None or not isinstance(v, (int, float)) or math.isnan(v):
        return "dim"
    if metric.startswith(("symmetry", "directionality", "delta_symmetry", "delta_directionality")):
        return _diverging(max(-1.0, min(1.0, float(v))))
    if metric.startswith(("overlap", "cka", "delta_overlap")):
        return _sequential(max(0.0, min(1.0, abs(float(v)))))
    return ""


def _diverging(x: float) -> str:
    level = int(110 + 145 * abs(x))
    return f"rgb({level},90,90)" if x > 0 else f"rgb(90,120,{level})"


def _sequential(x: float) -> str:
    return f"rgb(80,{int(110 + 145 * x)},100)"


def head_table(heads: Iterable, columns: Sequence[str], *, grouped: bool = True, title: str | None = None):
    """One row per head; with `grouped`, a rule between layers (rows arrive in block, layer, head order)."""
    from rich.table import Table

    t = Table(title=title, header_style="bold", show_edge=False, pad_edge=False)
    for name in ("block", "layer", "head", "kv"):
        t.add_column(name, justify="left" if name == "block" else "right")
    marked = set(basis_dependent(c.removeprefix("delta_") for c in columns))
    for c in columns:
        t.add_column(c + ("*" if c.removeprefix("delta_") in marked else ""), justify="right")
    last = None
    for h in heads:
        if grouped and last is not None and (h.block, h.layer) != last:
            t.add_section()
        last = (h.block, h.layer)
        cells = [_cell(c, h.values.get(c)) for c in columns]
        t.add_row(h.block, str(h.layer), str(h.head), str(h.kv_head), *cells)
    return t


def _cell(metric: str, v: Any):
    from rich.text import Text

    return Text(fmt_value(v), style=scale_style(metric, v))


def layer_table(layers: Iterable, columns: Sequence[str] | None = None, title: str | None = "per layer"):
    from rich.table import Table

    layers = list(layers)
    have = {k for r in layers for k in r.values}
    cols = [c for c in (columns or LAYER_COLUMNS) if c in have]
    t = Table(title=title, header_style="bold", show_edge=False, pad_edge=False)
    for name in ("block", "layer", "heads"):
        t.add_column(name, justify="left" if name == "block" else "right")
    for c in cols:
        t.add_column(c, justify="right")
    for r in layers:
        t.add_row(r.block, str(r.layer), str(r.n_heads), *[_cell(c, r.values.get(c)) for c in cols])
    return t


def baseline_lines(baselines: Iterable, metrics: Sequence[str] = BASELINE_METRICS) -> list[str]:
    """'random baseline (encoder, 32 Gaussian heads): symmetry 0.003 ± 0.003, overlap_qk 0.084 ± 0.003'."""
    by_block: dict[str, list] = {}
    for b in baselines:
        if b.metric in metrics:
            by_block.setdefault(b.block, []).append(b)
    lines = []
    for block, bs in by_block.items():
        parts = ", ".join(f"{b.metric} {fmt_value(b.mean)} ± {fmt_value(b.std)}" for b in bs)
        lines.append(f"random baseline ({block}, {bs[0].n} Gaussian heads): {parts}")
    return lines


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


def gauge_note(console, columns: Iterable[str]) -> None:
    """The footnote for columns marked '*' by `head_table`."""
    marked = basis_dependent(c.removeprefix("delta_") for c in columns)
    if marked:
        console.print(f"* not gauge-invariant (depends on the basis of the head space): {', '.join(marked)}",
                      style="dim", highlight=False)


def render_analysis(console, result, *, columns: Sequence[str], by: str = "head", grouped: bool = True,
                    notes: Sequence[str] = ()) -> None:
    """The whole human view of an AnalysisResult."""
    console.print(model_line(result.model, result.processing), markup=False, highlight=False, soft_wrap=True)
    if any(b.positional == "rope" for b in result.model.blocks):
        console.print("rotary positions: the metrics describe the form at offset 0", style="dim")
    if by == "head":
        console.print(head_table(result.heads, columns, grouped=grouped))
    subset = getattr(result.processing, "heads", None) is not None
    console.print(layer_table(result.layers, title="per layer (over the selected heads)" if subset else "per layer"))
    for line in baseline_lines(result.baselines):
        console.print(line, style="dim", highlight=False)
    if by == "head":
        gauge_note(console, columns)
    for n in notes:
        console.print(n, style="dim", highlight=False)
