"""Composition figures and the report's composition section (`qkinspect plot --kind composition`, `qkinspect report
MODEL --composition FILE.json`): per kind, a layer x layer summary (the root mean square over each pair of layers'
head pairs) over a head x head heatmap, both as score / null on one colour scale, so 1 is what random heads give."""

from __future__ import annotations

import math

import numpy as np
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from qkinspect.composition.results import CompositionResult
from qkinspect.errors import InputError
from qkinspect.report.pages import TextPages
from qkinspect.report.style import MISSING, Canvas, fmt, new_figure
from qkinspect.report.tables import Table
from qkinspect.report.titles import suptitle

CMAP = "magma"
KIND_TITLE = {"q": "Q-composition", "k": "K-composition", "v": "V-composition"}
CAPTION = ("Composition of earlier heads (rows) into later heads (columns), as score / null: 1 is the root-mean-square "
           "score of random Gaussian heads (1/√d_model), so a cell above 1 composes more than chance. Top: one cell "
           "per pair of layers, the root mean square over its head pairs (1: random heads on average). Bottom: "
           "every head pair, heads in layer order with lines between layers. Q: the earlier head writes what the "
           "later head's queries read; K: its keys; V: its values. Grey: no such pair (a head composes only into "
           "later layers). The colour scale stops at the 0.999 quantile of the ratios (at least 2); an arrow at "
           "the top of the colour bar marks ratios above it, drawn in its top colour, and its label gives the "
           "largest.")
LISTED = 10  # rows of each table in the report


def axes_units(result: CompositionResult) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """The earlier and later layers that have scores, (block, layer), in residual order (as the result lists them)."""
    rows = list(dict.fromkeys((k[0], k[1]) for k in result.scores))
    cols = list(dict.fromkeys((k[2], k[3]) for k in result.scores))
    blocks = [b.key for b in result.model.blocks]
    order = lambda u: (blocks.index(u[0]) if u[0] != "cross" else blocks.index("cross"), u[1])  # noqa: E731
    return sorted(rows, key=order), sorted(cols, key=order)


def layer_grid(result: CompositionResult, kind: str) -> np.ndarray:
    """(earlier layers, later layers): the root mean square of the selected head pairs' scores over the null (the
    null is itself a root mean square: 1 is random heads on average, whatever the number of heads); NaN where no
    pair."""
    rows, cols = axes_units(result)
    out = np.full((len(rows), len(cols)), np.nan)
    for key, s in result.scores.items():
        if key[4] == kind:
            a, b = result.heads(key)
            sub = s[np.ix_(a, b)] / result.baseline(key[0], key[2])
            if np.isfinite(sub).any():
                out[rows.index(key[:2]), cols.index(key[2:4])] = np.sqrt(np.nanmean(sub**2))
    return out


def head_grid(result: CompositionResult, kind: str) -> tuple[np.ndarray, list[int], list[int]]:
    """(earlier heads, later heads) ratios, heads in layer order; and where each layer starts on either axis."""
    rows, cols = axes_units(result)
    size = {b.key: b.n_heads for b in result.model.blocks}
    later = {b.key: b.n_kv_heads if result.by_kv else b.n_heads for b in result.model.blocks}  # by kv-head: G_b
    r0 = np.cumsum([0] + [size[u[0]] for u in rows])
    c0 = np.cumsum([0] + [later[u[0]] for u in cols])
    out = np.full((r0[-1], c0[-1]), np.nan)
    for key, s in result.scores.items():
        if key[4] == kind:
            i, j = rows.index(key[:2]), cols.index(key[2:4])
            a, b = result.heads(key)
            block = np.full(s.shape, np.nan)
            block[np.ix_(a, b)] = s[np.ix_(a, b)] / result.baseline(key[0], key[2])
            out[r0[i]:r0[i + 1], c0[j]:c0[j + 1]] = block
    return out, list(r0[:-1]), list(c0[:-1])


def _labels(units: list[tuple[str, int]], multi: bool) -> list[str]:
    short = {"encoder": "E", "decoder": "D", "cross": "C"}
    return [f"{short.get(b, b[:1].upper())}{i}" if multi else str(i) for b, i in units]


def _ticks(ax, axis: str, labels: list[str], starts: list[int] | None = None, max_ticks: int = 16) -> None:
    n = len(labels)
    step = max(1, math.ceil(n / max_ticks))
    idx = list(range(0, n, step))
    pos = [starts[i] if starts is not None else i for i in idx]
    (ax.set_xticks if axis == "x" else ax.set_yticks)(pos)
    (ax.set_xticklabels if axis == "x" else ax.set_yticklabels)([labels[i] for i in idx])


def composition_figure(result: CompositionResult, canvas: Canvas = new_figure, title: str | None = None) -> Figure:
    """The composition figure: one column per kind; a layer x layer summary over a head x head heatmap.

    Raises:
        InputError: the result holds no scores.
    """
    kinds = [k for k in result.processing.kinds if any(key[4] == k for key in result.scores)]
    if not kinds:
        raise InputError("no composition scores to draw")
    rows, cols = axes_units(result)
    multi = result.multi_block
    grids = {k: layer_grid(result, k) for k in kinds}
    heads = {k: head_grid(result, k) for k in kinds}
    finite = np.concatenate([g[np.isfinite(g)] for g, _, _ in heads.values()])
    top = float(np.quantile(finite, 0.999)) if finite.size else 1.0
    norm = Normalize(0.0, max(2.0, top))
    largest = float(finite.max()) if finite.size else 0.0
    cut = largest > norm.vmax  # the scale stops at the 0.999 quantile: the few pairs above it share its top colour
    n = len(kinds)
    width = 7.0
    panel = (width - 0.9) / n
    height = panel * (len(rows) / max(len(cols), 1)) * 2 + 1.3
    fig = canvas(min(height, 9.5), width)
    axes = fig.subplots(2, n, squeeze=False)
    cm = _cmap()
    for c, kind in enumerate(kinds):
        top_ax, low_ax = axes[0][c], axes[1][c]
        im = top_ax.imshow(grids[kind], cmap=cm, norm=norm, aspect="auto", interpolation="nearest")
        top_ax.set_title(f"{KIND_TITLE[kind]}: layers", fontsize=9)
        _ticks(top_ax, "x", _labels(cols, multi), max_ticks=max(4, 24 // n))
        _ticks(top_ax, "y", _labels(rows, multi))
        grid, r0, c0 = heads[kind]
        low_ax.imshow(grid, cmap=cm, norm=norm, aspect="auto", interpolation="nearest")
        for x in c0[1:]:  # thin lines between layers
            low_ax.axvline(x - 0.5, color="white", lw=0.15, alpha=0.7)
        for y in r0[1:]:
            low_ax.axhline(y - 0.5, color="white", lw=0.15, alpha=0.7)
        low_ax.set_title(f"{KIND_TITLE[kind]}: heads", fontsize=9)
        mid_c = [(a + b) / 2 - 0.5 for a, b in zip(c0, [*c0[1:], grid.shape[1]], strict=True)]  # layer centres
        mid_r = [(a + b) / 2 - 0.5 for a, b in zip(r0, [*r0[1:], grid.shape[0]], strict=True)]
        _ticks(low_ax, "x", _labels(cols, multi), mid_c, max_ticks=max(4, 24 // n))
        _ticks(low_ax, "y", _labels(rows, multi), mid_r, max_ticks=16)
        for ax in (top_ax, low_ax):
            ax.set_xlabel("later layer (b)")
            ax.set_ylabel("earlier layer (a)" if c == 0 else "")
            ax.set_facecolor(MISSING)
    cb = fig.colorbar(im, ax=axes, shrink=0.6, aspect=30, pad=0.02, extend="max" if cut else "neither")
    cb.set_label("score / null (1 = random heads)" + (f"; the arrow: above {norm.vmax:.2f}, up to {largest:.2f}"
                                                       if cut else ""))
    cb.ax.axhline(1.0, color="white", lw=1.5)
    suptitle(fig, title or f"{result.model.name}: composition between heads (score / null)")
    return fig


def _cmap():
    import matplotlib

    cm = matplotlib.colormaps[CMAP]
    return cm.with_extremes(bad=MISSING, over=cm(1.0))  # past the scale's top: its top colour (the bar's arrow)


def top_table(result: CompositionResult, kind: str, n: int = LISTED) -> Table | None:
    recs = result.top(kind, n)
    if not recs:
        return None
    multi = result.multi_block
    name = lambda b, layer, h: f"{b + ' ' if multi else ''}layer {layer} head {h}"  # noqa: E731
    later = (lambda r: name(r.to_block, r.to_layer, r.to_head)) if not result.by_kv else (  # noqa: E731
        lambda r: f"{r.to_block + ' ' if multi else ''}layer {r.to_layer} kv {r.to_head} ({len(r.to_heads)} q)")
    rows = [[name(r.from_block, r.from_layer, r.from_head), later(r), fmt(r.score), fmt(r.ratio)] for r in recs]
    return Table(f"{KIND_TITLE[kind]}: the {len(recs)} strongest pairs", ["earlier head a", "later head b" if not
                                                                            result.by_kv else "later key/value head b",
                                                                            "score", "score / null"], rows)


def composition_section(pages: TextPages, result: CompositionResult, add_figure) -> None:
    """The report's composition section: what the scores mean, the figure (drawn by `add_figure(draw, caption)`,
    the report's page placement) and the strongest pairs per kind."""
    p = result.processing
    pages.new_page()
    pages.heading("Heads together: composition")
    pages.paragraph(
        "How strongly each earlier head's output feeds a later head's queries (Q), keys (K) or values (V), from the "
        "weights alone (Elhage et al. 2021): Q-composition is ‖W_OV^a W_QK^b‖_F / (‖W_OV^a‖_F ‖W_QK^b‖_F), with "
        "W_OV = W_V W_O and W_QK = W_Q W_Kᵀ; K uses W_QK^bᵀ and V uses W_OV^b. Random Gaussian heads score "
        "1/√d_model in root mean square (exactly, whatever the head widths), so each score is shown divided by "
        "that null: a ratio of 1 is chance.")
    how = ("each layer's input-norm gain folded into W_Q, W_K and W_V" if p.fold_ln else "the weights as stored")
    pages.paragraph(f"Computed with {how}, in {p.precision} products of float64-reduced factors.")
    for q in result.pairs:
        pages.paragraph(f"{q.from_block} → {q.to_block} ({', '.join(q.kinds)}): {q.rule}.", size=8.5)
    add_figure(lambda canvas: composition_figure(result, canvas=canvas), CAPTION)
    for kind in p.kinds:
        t = top_table(result, kind)
        if t is not None:
            pages.table(t)
