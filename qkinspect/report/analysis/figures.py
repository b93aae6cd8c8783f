"""One function per figure kind, each returning a matplotlib Figure built from an AnalysisResult.

Figures only read records. Every figure has a title with the model's name, axis labels with units
and, where colour encodes a value, a colour bar.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from qkinspect.analysis.results import AnalysisResult
from qkinspect.errors import InputError
from qkinspect.metrics.registry import head_metric
from qkinspect.report import heatmap
from qkinspect.report.analysis import curves
from qkinspect.report.analysis.arrays import blocks_of, head_grid, layer_record, require, title
from qkinspect.report.analysis.summary import qk_norm_caveat
from qkinspect.report.grid import Grid
from qkinspect.report.style import (
    DIVERGING,
    SEQUENTIAL,
    WIDTH,
    Canvas,
    fmt,
    human_name,
    new_figure,
    panel_grid,
    style,
)
from qkinspect.report.titles import retitle, suptitle

SYMMETRY_LABEL = "symmetry score s (−1 … +1)"
OVERLAP_LABEL = "subspace overlap\n(mean cos² of principal angles)"
OVERLAPS = (("overlap_qk", "Q / K"), ("overlap_qv", "Q / V"), ("overlap_kv", "K / V"))


def _baseline_text(result: AnalysisResult, block: str, metric: str, short: bool = False) -> str:
    b = result.baseline(block, metric)
    what = "random" if short else "random baseline"
    return "no random baseline" if b is None else f"{what} {fmt(b.mean)} ± {fmt(b.std)}"


def symmetry(result: AnalysisResult, canvas: Canvas = new_figure) -> Figure:
    """Layer x head heatmap of the symmetry score, one panel per block, diverging colours centred at 0.

    Example:
        >>> fig = symmetry(qkinspect.analyze("path/to/model"))
        >>> fig.savefig("symmetry.png")
    """
    require(result, "symmetry", kind="symmetry")
    grids = [head_grid(result, b, "symmetry") for b in blocks_of(result)]
    n_layers = [len(g.layers) for g in grids]
    with style():
        fig = canvas(heatmap.height_for(n_layers))
        axes = heatmap.block_rows(fig, n_layers, 1)[:, 0]
        norm = heatmap.diverging_norm(*(g.values for g in grids))
        for ax, g in zip(axes, grids, strict=True):
            im = heatmap.draw(ax, g, norm)
            base = _baseline_text(result, g.block, "symmetry")
            ax.set_title(f"{g.block}: {len(g.layers)} layers × {len(g.heads)} heads; {base}", loc="left")
        heatmap.colorbar(fig, im, list(axes), SYMMETRY_LABEL)
        suptitle(fig, title(result, "symmetry of W_Q W_Kᵀ per head"))
    return fig


def overlap(result: AnalysisResult, canvas: Canvas = new_figure) -> Figure:
    """Q/K, Q/V and K/V subspace overlap per head: small multiples (rows = blocks) on one colour scale."""
    require(result, "overlap_qk", kind="overlap")
    blocks = blocks_of(result)
    grids = {(b, m): head_grid(result, b, m) for b in blocks for m, _ in OVERLAPS}
    n_layers = [len(grids[b, "overlap_qk"].layers) for b in blocks]
    with style():
        fig = canvas(heatmap.height_for(n_layers, per_layer=0.15))
        axes = heatmap.block_rows(fig, n_layers, 3, sharey="row")
        norm = heatmap.unit_norm(*(g.values for g in grids.values()))
        for i, b in enumerate(blocks):
            for j, (m, name) in enumerate(OVERLAPS):
                ax = axes[i, j]
                im = heatmap.draw(ax, grids[b, m], norm, SEQUENTIAL, annotate=False, max_ticks=8)
                ax.set_title(f"{b}: {name}\n{_baseline_text(result, b, m, short=True)}", loc="left", fontsize=8)
                if j:
                    ax.set_ylabel("")
        heatmap.colorbar(fig, im, axes.ravel().tolist(), OVERLAP_LABEL, _shared_baseline(result, blocks))
        suptitle(fig, title(result, "overlap of the Q, K and V column spaces per head"))
    return fig


def metric(result: AnalysisResult, name: str, canvas: Canvas = new_figure) -> Figure:
    """Layer x head heatmap of any per-head metric, one panel per block on one colour scale: diverging around 0
    for signed metrics in [-1, 1], else over the data's range. A basis-dependent metric says so in the title.

    Example:
        >>> fig = metric(qkinspect.analyze("path/to/model", metrics=["eigen"]), "shared_qk_distance")
    """
    spec = head_metric(name)
    require(result, name, kind="metric")
    grids = [head_grid(result, b, name) for b in blocks_of(result)]
    n_layers = [len(g.layers) for g in grids]
    values = [g.values for g in grids]
    if spec.range == "[-1, 1]":
        norm, colours = heatmap.diverging_norm(*values), DIVERGING
    else:  # bounded or not, the scale spans the data (0.67-0.96 on a 0-1 scale would be one colour)
        norm, colours = heatmap.data_norm(*values), SEQUENTIAL
    with style():
        fig = canvas(heatmap.height_for(n_layers))
        axes = heatmap.block_rows(fig, n_layers, 1)[:, 0]
        bases = [result.baseline(g.block, name) for g in grids]
        for ax, g, base in zip(axes, grids, bases, strict=True):
            im = heatmap.draw(ax, g, norm, colours)
            extra = "" if base is None else f"; {_baseline_text(result, g.block, name)}"
            ax.set_title(f"{g.block}: {len(g.layers)} layers × {len(g.heads)} heads{extra}", loc="left")
        mark = bases[0].mean if len(set(bases)) == 1 and bases[0] is not None else None  # one baseline for all
        heatmap.colorbar(fig, im, list(axes), f"{human_name(name)}\n({name}, range {spec.range})", mark)
        gauge = {"yes": "", "orthogonal": " (invariant under orthogonal re-basings only)",
                 "no": " (basis-dependent: not gauge-invariant)"}[spec.gauge_invariant]
        suptitle(fig, title(result, f"{human_name(name)} per head{gauge}"))
    return fig


def _shared_baseline(result: AnalysisResult, blocks: list[str]) -> float | None:
    """The Q/K overlap baseline when every block and pair has the same one (then the colour bar marks it)."""
    vals = [result.baseline(b, m) for b in blocks for m, _ in OVERLAPS]
    if not vals or any(v is None for v in vals):
        return None
    means = [v.mean for v in vals]
    return means[0] if max(means) - min(means) <= 1e-3 else None


def heads(result: AnalysisResult, layer: int | None = None, block: str | None = None,
          canvas: Canvas = new_figure) -> Figure:
    """The head x head overlap of query subspaces within one layer (`layer`), or every layer of a block
    as small multiples on one colour scale (`layer=None`). The diagonal (always 1) is left grey."""
    block = block or _first_block_with_overlap(result)
    layers = [layer] if layer is not None else sorted(r.layer for r in result.layers if r.block == block)
    mats = [_head_overlap(result, block, i) for i in layers]
    if not mats:
        raise InputError(f"the heads figure has no {block} layer with a head-by-head overlap matrix")
    n = len(mats)
    nrows, ncols, height = _heads_grid(n)
    with style():
        fig = canvas(5.8, 6.2) if n == 1 else canvas(height)
        # shared axes: tick labels only on the outer panels, so small multiples do not crowd each other
        axes = fig.subplots(nrows, ncols, squeeze=False, sharex=n > 1, sharey=n > 1).ravel()
        norm = heatmap.unit_norm(*mats)
        for ax, i, m in zip(axes, layers, mats, strict=False):
            im = heatmap.draw_square(ax, m, norm, max_ticks=16 if n == 1 else 8 if n <= 4 else 4)
            ax.set_title(f"layer {i}", loc="left")
            if n > 1:
                ax.set_xlabel("")
                ax.set_ylabel("")
        for ax in axes[n:]:
            ax.set_visible(False)
        for ax in axes[max(0, n - ncols):n]:
            ax.tick_params(labelbottom=True)  # the lowest panel of each column, also above an empty cell
        if n > 1:
            fig.supxlabel("head index")
            fig.supylabel("head index")
        heatmap.colorbar(fig, im, axes[:n].tolist(), "query-space overlap\n(mean cos²; diagonal = 1)",
                         heads_chance(result, block))
        what = f"{block} layer {layers[0]}" if n == 1 else f"every {block} layer"
        suptitle(fig, title(result, f"head-by-head overlap of query spaces, {what}"))
    return fig


def heads_chance(result: AnalysisResult, block: str) -> float | None:
    """The head-by-head overlap two heads' query spaces have by chance: two uniformly random d_head-dimensional
    subspaces of the d_model-dimensional input have mean cos² of their principal angles d_head / d_model in
    expectation (the mean of the `overlap` figure's random baseline, which draws such subspaces)."""
    spec = next((b for b in result.model.blocks if b.key == block), None)
    return None if spec is None or not spec.d_model else min(1.0, spec.d_head / spec.d_model)


HEADS_MAX_HEIGHT = 9.5  # inches: a page's text height less a caption


def _heads_grid(n: int) -> tuple[int, int, float]:
    """(rows, columns, figure height) for n square panels at WIDTH: each row as tall as its panels are wide
    (the width less the colour bar and labels, shared among the columns) plus its title, so that deep models leave
    no empty band between rows; more columns while the rows would not fit HEADS_MAX_HEIGHT."""
    nrows, ncols = panel_grid(n, 4 if n <= 16 else 6)  # deep models: more, smaller panels per row
    while True:
        side = (WIDTH - 2.8) / ncols  # inches a square panel gets: colour bar, labels and gaps take ~2.8 in
        height = nrows * (side + 0.3) + 0.8  # + each panel's title and gap; + the suptitle and x label
        if height <= HEADS_MAX_HEIGHT or ncols >= n:
            return nrows, ncols, min(height, HEADS_MAX_HEIGHT)
        ncols += 1
        nrows = -(-n // ncols)


def _first_block_with_overlap(result: AnalysisResult) -> str:
    for b in blocks_of(result):
        if any(r.block == b and r.head_overlap is not None for r in result.layers):
            return b
    raise InputError("the heads figure needs head-by-head overlap matrices, and this analysis holds none "
                     "(analyze --metrics default,head_overlap measures them)")


def _head_overlap(result: AnalysisResult, block: str, layer: int) -> np.ndarray:
    rec = layer_record(result, block, layer)
    if rec is None or rec.head_overlap is None:
        have = sorted(r.layer for r in result.layers if r.block == block and r.head_overlap is not None)
        raise InputError(f"no head-by-head overlap for {block} layer {layer}; layers that have one: "
                         f"{', '.join(map(str, have)) or 'none'}")
    m = np.array(rec.head_overlap, dtype=float)  # (H, H)
    np.fill_diagonal(m, np.nan)  # always 1: greyed so it does not set the colour scale
    return m


def compare(a: AnalysisResult, b: AnalysisResult, canvas: Canvas = new_figure) -> Figure:
    """Per-head change from model A to model B (B − A) in symmetry and effective rank, for heads both share.

    Example:
        >>> fig = compare(qkinspect.analyze("base"), qkinspect.analyze("finetuned"))
    """
    pairs = _compare_grids(a, b)
    n_layers = [len(p[0].layers) for p in pairs]
    labels = ("change in symmetry score\n(B − A)", "change in effective rank\n(B − A, dimensions)")
    with style():
        fig = canvas(heatmap.height_for(n_layers, per_layer=0.15))
        axes = heatmap.block_rows(fig, n_layers, 2)
        sym = [p[0] for p in pairs]
        norm = heatmap.diverging_norm(*(g.values for g in sym))
        for i, (g_sym, g_rank) in enumerate(pairs):
            im = heatmap.draw(axes[i, 0], g_sym, norm, annotate=False, max_ticks=8)
            axes[i, 0].set_title(f"{g_sym.block}: Δ symmetry", loc="left")
            # Rank changes are in dimensions, bounded by each block's d_head: one scale per block.
            im_rank = heatmap.draw(axes[i, 1], g_rank, heatmap.diverging_norm_unbounded(g_rank.values),
                                   annotate=False, max_ticks=8)
            axes[i, 1].set_title(f"{g_rank.block}: Δ effective rank", loc="left")
            heatmap.colorbar(fig, im_rank, [axes[i, 1]], labels[1] if i == len(pairs) // 2 else "")
        heatmap.colorbar(fig, im, axes[:, 0].tolist(), labels[0])
        suptitle(fig, f"A = {a.model.name}  →  B = {b.model.name}: per-head change")
    return fig


def _compare_grids(a: AnalysisResult, b: AnalysisResult) -> list[tuple[Grid, Grid]]:
    for r in (a, b):
        require(r, "symmetry", "qk_effective_rank", kind="compare")
    out = []
    for blk in [x for x in blocks_of(a) if x in blocks_of(b)]:
        pair = tuple(_diff(head_grid(a, blk, m), head_grid(b, blk, m)) for m in ("symmetry", "qk_effective_rank"))
        if pair[0].values.size:
            out.append(pair)
    if not out:
        raise InputError(f"{a.model.name} and {b.model.name} share no (block, layer, head) to compare")
    return out


def _diff(ga: Grid, gb: Grid) -> Grid:
    """B − A on the layers and heads both grids hold."""
    layers = [x for x in ga.layers if x in gb.layers]
    heads = [x for x in ga.heads if x in gb.heads]

    def pick(g: Grid) -> np.ndarray:
        return g.values[np.ix_([g.layers.index(x) for x in layers], [g.heads.index(x) for x in heads])]

    return Grid(ga.block, ga.metric, layers, heads, pick(gb) - pick(ga))  # (n_layers, n_heads)


spectra = curves.spectra
rank = curves.rank
distribution = curves.distribution

KINDS = ("symmetry", "overlap", "spectra", "rank", "distribution", "heads", "compare", "metric")
_SINGLE = {"symmetry": symmetry, "overlap": overlap, "spectra": spectra, "rank": rank, "distribution": distribution}


def figure(result: AnalysisResult, kind: str, *, layer: int | None = None, block: str | None = None,
           other: AnalysisResult | None = None, metric_name: str | None = None,
           canvas: Canvas = new_figure, title: str | None = None) -> Figure:
    """Build the figure `kind` (one of KINDS). `layer`/`block` choose the layer for `heads`; `other` is model B
    for `compare`; `metric_name` the per-head metric of `metric`; `canvas(height, width)` makes the Figure (or
    SubFigure) to draw on; `title` replaces the figure's title (wrapped to fit, like every title).

    Raises:
        InputError: unknown kind, or the analysis lacks what the figure needs.

    Example:
        >>> fig = figure(result, "symmetry")
    """
    if kind not in KINDS:
        raise InputError(f"unknown figure kind {kind!r}; choose one of: {', '.join(KINDS)}")
    if kind == "heads":
        return retitle(heads(result, layer, block, canvas), title)
    if kind == "compare":
        if other is None:
            raise InputError("the compare figure needs a second model (--compare MODEL_B)")
        fig = retitle(compare(result, other, canvas), title)
        return with_caveat(fig, qk_norm_caveat(result, short=True) or qk_norm_caveat(other, short=True))
    if kind == "metric":
        if metric_name is None:
            raise InputError("the metric figure needs a metric name (--metric NAME)")
        fig = retitle(metric(result, metric_name, canvas), title)
        return with_caveat(fig, qk_norm_caveat(result, short=True) if shows_raw_qk(kind, metric_name) else "")
    return with_caveat(retitle(_SINGLE[kind](result, canvas), title),
                   qk_norm_caveat(result, short=True) if shows_raw_qk(kind) else "")


# Metrics that q/k-norm gains leave as they are: column spaces (W_Q diag(γ) spans what W_Q spans) and the OV
# circuit; every other metric reads W_Q or W_K themselves.
_GAIN_FREE = ("overlap_", "ov_", "norm_v_", "bias_v_")


def shows_raw_qk(kind: str, metric_name: str | None = None) -> bool:
    """Whether the figure `kind` (with `metric_name` for `metric`) shows numbers that folding q/k-norm gains
    changes: W_Q W_Kᵀ's symmetry, ranks and spectra, or a metric of W_Q or W_K; not the overlap of column spaces
    (`overlap`, `heads`), which the gains leave as they are."""
    if kind == "metric":
        return metric_name is not None and not metric_name.startswith(_GAIN_FREE)
    return kind in ("symmetry", "distribution", "rank", "spectra", "compare")


def with_caveat(fig: Figure, text: str) -> Figure:
    """`text` (a q/k-norm caveat) as the last line of the figure's title, wrapped to its width: the title is the
    one place every figure keeps clear of its panels, legends and labels."""
    if not text:
        return fig
    from qkinspect.report.titles import PAD, canvas_width, fit

    with style():
        fig.suptitle(f"{fig.get_suptitle()}\n{fit(text, canvas_width(fig) - 2 * PAD, 11)}")
    return fig
