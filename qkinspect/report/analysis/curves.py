"""Figures drawn as curves rather than heatmaps: singular-value spectra, ranks by layer, symmetry histograms."""

from __future__ import annotations

import math

import matplotlib
import numpy as np
from matplotlib.cm import ScalarMappable
from matplotlib.colors import BoundaryNorm
from matplotlib.figure import Figure

from qkinspect.analysis.results import AnalysisResult
from qkinspect.errors import InputError
from qkinspect.report.analysis.arrays import (
    block_values,
    blocks_of,
    d_head,
    head_grid,
    require,
    spectra_layers,
    spectra_of,
    title,
)
from qkinspect.report.style import HEADS_CMAP, Canvas, fmt, integer_ticks, new_figure, panel_grid, style, tick_step
from qkinspect.report.titles import suptitle

SPECTRUM_FLOOR = 1e-6  # σ_i/σ_1 below this is numerical zero: drawn at the floor so log axes stay finite
RANKS = (("qk_effective_rank", "effective rank"), ("qk_stable_rank", "stable rank"), ("qk_k90", "k90 (90% energy)"))


def spectra(result: AnalysisResult, canvas: Canvas = new_figure) -> Figure:
    """Singular values of W_Q W_Kᵀ per head, normalised by σ₁, on a log scale: one panel per layer,
    one line per head (colour = head index), the median over heads in black, d_head marked.

    Example:
        >>> fig = spectra(qkinspect.analyze("path/to/model", spectra=("qk",)))
    """
    pairs = spectra_layers(result)
    if not pairs:
        raise InputError("the spectra figure needs singular values, which this analysis does not hold (a saved "
                         "analysis' JSON keeps none: draw the spectra from the model; the library's analyze keeps "
                         "W_Q W_Kᵀ's unless its spectra argument leaves them out)")
    blocks = list(dict.fromkeys(b for b, _ in pairs))
    shapes = {b: _panel_grid(sum(1 for x, _ in pairs if x == b)) for b in blocks}
    rows = [shapes[b][0] for b in blocks]
    floor = _floor(result, pairs)
    with style():
        fig = canvas(min(9.5, 1.25 * sum(rows) + 0.45 * len(blocks) + 0.9))
        subs = np.atleast_1d(fig.subfigures(len(blocks), 1, height_ratios=[r + 0.4 for r in rows]))
        for sub, blk in zip(subs, blocks, strict=True):
            layers = [l for b, l in pairs if b == blk]
            _spectra_block(sub, result, blk, layers, shapes[blk], floor)
        fig.supxlabel("singular value index i (dotted line: d_head)")
        fig.supylabel("σᵢ / σ₁ (log scale)")
        suptitle(fig, title(result, "singular-value spectra of W_Q W_Kᵀ"))
    return fig


def _panel_grid(n: int) -> tuple[int, int]:
    """(rows, cols) for n small panels at paper width: about 3:2 wide, at most 8 columns, few empty cells."""
    return panel_grid(n, 8)


def _spectra_block(sub, result: AnalysisResult, blk: str, layers: list[int], shape, floor: float) -> None:
    """One block's panels (one per layer) in subfigure `sub`, with its own head-index colour bar."""
    b = result.model.block(blk)
    norm = heads_norm(b.n_heads)
    axes = sub.subplots(*shape, squeeze=False, sharex=True, sharey=True).ravel()
    for ax, layer in zip(axes, layers, strict=False):
        _spectrum_panel(ax, spectra_of(result, blk, layer), d_head(result, blk), norm, floor)
        ax.text(0.04, 0.05, f"layer {layer}", transform=ax.transAxes, ha="left", va="bottom", fontsize=7)
    for ax in axes[len(layers):]:
        ax.set_visible(False)
    axes[0].set_ylim(floor / 1.5, 1.5)
    cb = sub.colorbar(ScalarMappable(norm=norm, cmap=HEADS_CMAP), ax=list(axes[: len(layers)]), shrink=0.95,
                      aspect=25, pad=0.02, label="head index")
    cb.set_ticks(range(0, b.n_heads, tick_step(b.n_heads, 12)))  # one colour per head: the bar is in steps
    suptitle(sub, f"{blk}: {len(layers)} layers × {b.n_heads} heads, d_head = {b.d_head}; black line: median over "
                 "heads", x=0.02, ha="left", fontsize=9)


def _floor(result: AnalysisResult, pairs) -> float:
    lows = []
    for blk, layer in pairs:
        for sv in spectra_of(result, blk, layer).values():
            r = sv[sv > 0] / sv[0] if sv.size and sv[0] > 0 else np.array([])
            if r.size:
                lows.append(r.min())
    low = max(min(lows, default=1e-3), SPECTRUM_FLOOR)
    return 10 ** math.floor(math.log10(low))


def heads_norm(n_heads: int) -> BoundaryNorm:
    """One colour step per head index 0 … n_heads − 1 (a discrete colour bar: heads are not a continuum)."""
    return BoundaryNorm(np.arange(-0.5, max(n_heads, 2) + 0.5), matplotlib.colormaps[HEADS_CMAP].N)


def _spectrum_panel(ax, svs: dict[int, np.ndarray], d: int, norm, floor: float) -> None:
    cmap = matplotlib.colormaps[HEADS_CMAP]
    ratios = []
    for h, sv in svs.items():
        if not sv.size or not np.isfinite(sv[0]) or sv[0] <= 0:
            continue
        r = np.maximum(sv / sv[0], floor)
        ratios.append(r)
        ax.plot(np.arange(1, r.size + 1), r, color=cmap(norm(h)), lw=0.7, alpha=0.75)
    if ratios:
        k = min(r.size for r in ratios)
        med = np.median(np.stack([r[:k] for r in ratios]), axis=0)  # (n_heads, k) -> (k,)
        ax.plot(np.arange(1, k + 1), med, color="black", lw=1.4)
    ax.axvline(d, color="0.3", ls=":", lw=1)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(numticks=4))
    ax.grid(True, which="major", axis="y")


def rank(result: AnalysisResult, canvas: Canvas = new_figure) -> Figure:
    """Effective rank, stable rank and k90 of W_Q W_Kᵀ by layer: the median over heads (dots), the middle half
    of heads (thick bar) and all heads (thin bar), with d_head (the largest possible rank) dashed."""
    require(result, "qk_effective_rank", kind="rank")
    blocks = blocks_of(result)
    with style():
        fig = canvas(min(9.5, 2.3 * len(blocks) + 0.8))
        axes = fig.subplots(len(blocks), 3, squeeze=False)
        for i, blk in enumerate(blocks):
            for j, (metric, name) in enumerate(RANKS):
                _rank_panel(axes[i, j], result, blk, metric)
                axes[i, j].set_title(f"{blk}: {name}", loc="left")
                axes[i, j].set_xlabel("layer index")
            axes[i, 0].set_ylabel("rank (dimensions)")
        fig.legend(handles=_rank_legend(), loc="outside lower center", ncols=2, frameon=False)
        suptitle(fig, title(result, "how low-rank W_Q W_Kᵀ is, by layer"))
    return fig


def _rank_legend() -> list:
    from matplotlib.lines import Line2D

    return [Line2D([], [], color="black", marker="o", ms=3, lw=1, label="median over heads"),
            Line2D([], [], color="C0", lw=4, alpha=0.8, label="middle 50% of heads"),
            Line2D([], [], color="C0", lw=1, alpha=0.6, label="all heads (min … max)"),
            Line2D([], [], color="0.3", ls="--", lw=1, label="d_head (largest possible rank)")]


def _rank_panel(ax, result: AnalysisResult, block: str, metric: str) -> None:
    g = head_grid(result, block, metric)
    d = d_head(result, block)
    x = np.array(g.layers)
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN layers: no bar, no warning
            q = np.nanpercentile(g.values, [0, 25, 50, 75, 100], axis=1)  # (5, n_layers)
    ax.vlines(x, q[0], q[4], color="C0", lw=1, alpha=0.6)
    ax.vlines(x, q[1], q[3], color="C0", lw=4, alpha=0.8)
    ax.plot(x, q[2], "o-", color="black", ms=3, lw=1)
    ax.axhline(d, color="0.3", ls="--", lw=1)
    ax.annotate(f"d_head = {d}", (x.min() if x.size else 0, d), xytext=(0, 3), textcoords="offset points",
                va="bottom", ha="left", fontsize=7, color="0.3")  # above its line, not on it
    ax.set_ylim(0, d * 1.2)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True, nbins=8))


def distribution(result: AnalysisResult, canvas: Canvas = new_figure) -> Figure:
    """Histogram of the symmetry score over every head of each block, against the random baseline
    (Gaussian factors of the same shapes): mean ± 3 sd shaded."""
    require(result, "symmetry", kind="distribution")
    blocks = blocks_of(result)
    with style():
        fig = canvas(min(9.0, 2.4 * len(blocks) + 0.8))
        axes = fig.subplots(len(blocks), 1, squeeze=False)[:, 0]
        for ax, blk in zip(axes, blocks, strict=False):
            _histogram(ax, result, blk)
        axes[-1].set_xlabel("symmetry score s (−1 antisymmetric … +1 symmetric)")
        suptitle(fig, title(result, "symmetry scores of all heads against chance"))
    return fig


def _histogram(ax, result: AnalysisResult, block: str) -> None:
    v = block_values(result, block, "symmetry")
    base = result.baseline(block, "symmetry")
    lo, hi = _hist_range(v, base)
    ax.hist(v, bins=int(np.clip(np.sqrt(v.size) * 2, 10, 40)), range=(lo, hi), color="C3", alpha=0.8,
            label=f"heads (n = {v.size}), median {fmt(np.median(v)) if v.size else 'n/a'}")
    if v.size:
        ax.axvline(np.median(v), color="C3", lw=1.5)
    if base is not None:
        ax.axvspan(base.mean - 3 * base.std, base.mean + 3 * base.std, color="0.5", alpha=0.35,
                   label=f"random baseline {fmt(base.mean)} ± {fmt(base.std)} (±3 sd shaded)")
        ax.axvline(base.mean, color="0.2", ls="--", lw=1)
    ax.set_xlim(lo, hi)
    ax.set_ylabel("number of heads")
    integer_ticks(ax, "y")
    ax.set_title(block, loc="right", fontweight="bold")
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), frameon=False, borderaxespad=0.2)


def _hist_range(v: np.ndarray, base) -> tuple[float, float]:
    pts = list(v) + ([base.mean - 3 * base.std, base.mean + 3 * base.std] if base is not None else [])
    lo, hi = (min(pts), max(pts)) if pts else (-1.0, 1.0)
    pad = max(0.05, 0.08 * (hi - lo))
    return max(-1.0, lo - pad), min(1.0, hi + pad)
