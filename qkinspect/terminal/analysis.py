"""`qkinspect analyze`'s tables for people, in a terminal and in a notebook (`AnalysisResult` renders itself with
them): per-head metrics grouped by block and layer, the per-layer summary, the random baseline, and the hint at the
metrics left out. Built from the shared pieces of `qkinspect.terminal.tables`.

Example:
    >>> from rich.console import Console
    >>> render_analysis(Console(), result, columns=default_columns(result))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from qkinspect.terminal.tables import (
    Column,
    basis_dependent,
    cell,
    empty_columns,
    fit_tables,
    fmt_value,
    gauge_note,
    head_table,
    legend,
    model_line,
    print_lines,
    qk_norm_line,
    short_name,
)

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
    cols = [m for m in (requested_head_metrics(requested) if requested else DEFAULT_COLUMNS) if m in have] or have[:8]
    if sort and sort in have and sort not in cols:
        cols.append(sort)
    return cols


def requested_head_metrics(requested: Sequence[str]) -> list[str]:
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


def layer_columns(layers: Sequence, columns: Sequence[str] | None = None) -> list[str]:
    have = {k for r in layers for k in r.values}
    return [c for c in (columns or LAYER_COLUMNS) if c in have]


def layer_table(layers: Iterable, columns: Sequence[str] | None = None, title: str | None = "per layer",
                width: int = 80) -> list:
    """Per-layer tables: the layer summaries (and the summed form's scores with --layer-form)."""
    layers = list(layers)
    cols = layer_columns(layers, columns)
    labels = [Column("block", [r.block for r in layers], left=True), Column("layer", [str(r.layer) for r in layers]),
              Column("heads", [str(r.n_heads) for r in layers])]
    if len({r.block for r in layers}) <= 1:
        labels = labels[1:]
    values = [Column(short_name(c), [cell(c, r.values.get(c)) for r in layers]) for c in cols]
    return fit_tables(labels, values, width=width, title=title)


def baseline_lines(baselines: Iterable, metrics: Sequence[str] = BASELINE_METRICS) -> list[str]:
    """'random baseline (encoder, 32 Gaussian heads): sym 0.003 ± 0.003, ovl_qk 0.084 ± 0.003'."""
    by_block: dict[str, list] = {}
    for b in baselines:
        if b.metric in metrics:
            by_block.setdefault(b.block, []).append(b)
    lines = []
    for block, bs in by_block.items():
        parts = ", ".join(f"{short_name(b.metric)} {fmt_value(b.mean)}±{fmt_value(b.std)}" for b in bs)
        lines.append(f"random baseline ({block}, {bs[0].n} Gaussian heads): {parts}")
    return lines


def render_analysis(console, result, *, columns: Sequence[str], by: str = "head", grouped: bool = True,
                    notes: Sequence[str] = ()) -> None:
    """The whole human view of an AnalysisResult."""
    console.print(model_line(result.model, result.processing), markup=False, highlight=False)
    if any(b.positional == "rope" for b in result.model.blocks):
        console.print("rotary positions: the metrics describe the form at offset 0", style="dim")
    unfolded = getattr(result.processing, "qk_norm_not_folded", ())
    if unfolded:
        console.print(qk_norm_line(unfolded), style="bold yellow", markup=False, highlight=False)
    width = console.width
    shown: list[str] = []
    notes = list(notes)
    if by == "head":
        for t in head_table(result.heads, columns, grouped=grouped, width=width):
            console.print(t)
        empty = empty_columns(result.heads, columns)
        shown += [c for c in columns if c not in empty]
        if empty:
            notes.append(f"no value for any head (not shown): {', '.join(empty)}")
    subset = getattr(result.processing, "heads", None) is not None
    layer_cols = layer_columns(result.layers)
    for t in layer_table(result.layers, title="per layer (over the selected heads)" if subset else "per layer",
                         width=width):
        console.print(t)
    shown += [c for c in layer_cols if c not in shown]
    baselines = baseline_lines(result.baselines)
    shown += [b.metric for b in result.baselines if b.metric in BASELINE_METRICS and b.metric not in shown]
    marked = basis_dependent(c.removeprefix("delta_") for c in shown) if by == "head" else []
    print_lines(console, [*baselines, legend(shown, marked)])
    if by == "head":
        gauge_note(console, shown)
    counted = [*shown, *(empty_columns(result.heads, columns) if by == "head" else [])]  # empty: noted above
    scalar = {k for r in [*result.heads, *result.layers] for k, v in r.values.items() if not isinstance(v, list)}
    tabular = [m for m in result.metric_names if m in scalar]  # not head_overlap's (H, H) matrices: JSON only
    print_lines(console, [*notes, hidden_hint(tabular, counted, by)])


def hidden_hint(computed: Sequence[str], shown: Iterable[str], by: str = "head") -> str:
    """'11 of 30 computed metrics shown; …' where the table leaves computed metrics out, else ""."""
    shown = set(shown)
    hidden = [m for m in computed if m not in shown]
    if not hidden:
        return ""
    where = "--by head --metrics all shows" if by != "head" else "--metrics all shows"
    n = len(computed)
    return f"{n - len(hidden)} of {n} computed metrics shown; {where} every one, JSON and CSV keep them all"
