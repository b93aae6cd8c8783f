"""Layer x head heatmaps and their colour bars, shared by the symmetry, overlap, heads and compare figures."""

from __future__ import annotations

import matplotlib
import numpy as np
from matplotlib.artist import Artist
from matplotlib.colors import Normalize, TwoSlopeNorm
from matplotlib.text import Text

from qkinspect.report.grid import Grid
from qkinspect.report.style import DIVERGING, MISSING, SEQUENTIAL, fmt, set_index_ticks, symmetric_limit

# Cell numbers are drawn only where they fit their cells (CellNumbers); past this many cells none could.
ANNOTATE_MAX_CELLS = 32 * 32
CELL_FILL = 0.9  # a number may take this fraction of its cell's width and height


def cmap(name: str):
    """A colour map whose NaN cells show as light grey (heads not analysed, undefined values)."""
    return matplotlib.colormaps[name].with_extremes(bad=MISSING)


def diverging_norm(*arrays: np.ndarray) -> TwoSlopeNorm:
    """Centred at 0, half-width fitted to the data so small signed values still show colour."""
    lim = symmetric_limit(np.concatenate([np.ravel(a) for a in arrays]) if arrays else [])
    return TwoSlopeNorm(vcenter=0.0, vmin=-lim, vmax=lim)


def diverging_norm_unbounded(*arrays: np.ndarray) -> TwoSlopeNorm:
    """Like `diverging_norm` for quantities not bounded by 1 (changes in rank, in dimensions)."""
    lim = symmetric_limit(np.concatenate([np.ravel(a) for a in arrays]), floor=0.1, cap=None)
    return TwoSlopeNorm(vcenter=0.0, vmin=-lim, vmax=lim)


def unit_norm(*arrays: np.ndarray, floor: float = 0.1) -> Normalize:
    """From 0 to the data's maximum rounded up (at most 1): overlaps far below 1 keep their contrast."""
    lim = symmetric_limit(np.concatenate([np.ravel(a) for a in arrays]), floor=floor)
    return Normalize(vmin=0.0, vmax=lim)


def data_norm(*arrays: np.ndarray) -> Normalize:
    """Over the finite values' range (a metric with no natural bounds: ranks, norms); a constant gets a unit span."""
    v = np.concatenate([np.ravel(a) for a in arrays])
    v = v[np.isfinite(v)]
    lo, hi = (float(v.min()), float(v.max())) if v.size else (0.0, 1.0)
    return Normalize(vmin=lo, vmax=hi if hi > lo else lo + 1.0)


def block_rows(fig, n_layers: list[int], ncols: int, **kw):
    """Panels with one row per block, each row as tall as its number of layers (at least 3)."""
    ratios = [max(n, 3) for n in n_layers]
    return fig.subplots(len(n_layers), ncols, squeeze=False, gridspec_kw={"height_ratios": ratios}, **kw)


def height_for(n_layers: list[int], per_layer: float = 0.2, per_block: float = 1.1) -> float:
    """Figure height (inches) for block rows of heatmaps: cells stay readable, the page is never exceeded."""
    return float(np.clip(sum(max(n, 3) for n in n_layers) * per_layer + per_block * len(n_layers) + 0.6, 3.2, 9.5))


def draw(ax, grid: Grid, norm, cmap_name: str = DIVERGING, annotate: bool = True, max_ticks: int = 16,
         number=fmt):
    """Draw one layer x head grid on `ax`; returns the image for a colour bar. With `annotate`, each cell's value
    (formatted by `number`) is written in it when every number fits its cell as drawn (CellNumbers)."""
    im = ax.imshow(np.ma.masked_invalid(grid.values), cmap=cmap(cmap_name), norm=norm, aspect="auto",
                   interpolation="nearest")
    set_index_ticks(ax, len(grid.heads), "x", grid.heads, max_ticks)
    set_index_ticks(ax, len(grid.layers), "y", grid.layers)
    ax.set_xlabel("head index")
    ax.set_ylabel("layer index")
    for side in ("top", "right"):
        ax.spines[side].set_visible(True)
    if annotate and grid.values.size <= ANNOTATE_MAX_CELLS:
        ax.add_artist(CellNumbers(grid.values, norm, cmap_name, number))
    return im


def draw_square(ax, matrix: np.ndarray, norm, cmap_name: str = SEQUENTIAL, label: str = "head",
                max_ticks: int = 16):
    """A head x head matrix (rows and columns are heads)."""
    im = ax.imshow(np.ma.masked_invalid(matrix), cmap=cmap(cmap_name), norm=norm, interpolation="nearest")
    set_index_ticks(ax, matrix.shape[1], "x", max_ticks=max_ticks)
    set_index_ticks(ax, matrix.shape[0], "y", max_ticks=max_ticks)
    ax.set_xlabel(f"{label} index")
    ax.set_ylabel(f"{label} index")
    for side in ("top", "right"):
        ax.spines[side].set_visible(True)
    return im


class CellNumbers(Artist):
    """The values of a layer x head image written in its cells, decided at each drawing: the numbers are drawn only
    when the widest and tallest of them fit CELL_FILL of a cell at the size the figure is drawn (a paper's column,
    an A4 page), else none is and the colour bar carries the scale. Numbers never overprint one another."""

    def __init__(self, values: np.ndarray, norm, cmap_name: str, number=fmt, fontsize: float = 6):
        super().__init__()
        self.values, self.norm, self.cmap_name, self.number, self.fontsize = values, norm, cmap_name, number, fontsize
        self.set_in_layout(False)  # inside the axes: constrained layout has nothing to make room for
        self.set_zorder(3)
        self.drawn: list[Text] = []  # the texts of the last drawing (none when they did not fit)

    def _texts(self) -> list[Text]:
        ax = self.axes
        out = []
        for (i, j), v in np.ndenumerate(self.values):  # (n_layers, n_heads): row i, column j
            if np.isfinite(v):
                t = Text(j, i, self.number(v), ha="center", va="center", fontsize=self.fontsize,
                         color=_ink(self.norm(v), self.cmap_name), transform=ax.transData, clip_on=True)
                t.set_figure(ax.figure)
                t.set_clip_path(ax.patch)
                out.append(t)
        return out

    def draw(self, renderer) -> None:
        self.drawn = []
        if not self.get_visible() or self.axes is None:
            return
        (x0, y0), (x1, y1) = self.axes.transData.transform([(0, 0), (1, 1)])
        cell_w, cell_h = abs(x1 - x0), abs(y1 - y0)  # one cell, in the renderer's pixels
        texts = self._texts()
        boxes = [t.get_window_extent(renderer) for t in texts]
        if not boxes or max(b.width for b in boxes) > CELL_FILL * cell_w or \
                max(b.height for b in boxes) > CELL_FILL * cell_h:
            return
        for t in texts:
            t.draw(renderer)
        self.drawn = texts


def _ink(level: float, cmap_name: str) -> str:
    """Black or white text, whichever reads on the cell colour."""
    r, g, b, _ = matplotlib.colormaps[cmap_name](float(np.clip(level, 0, 1)))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"


def colorbar(fig, im, axes, label: str, mark: float | None = None):
    """One colour bar for a set of panels; `mark` draws a black line across the bar (the random baseline)."""
    cb = fig.colorbar(im, ax=axes, shrink=0.9, aspect=30, pad=0.02)
    lo, hi = cb.mappable.norm.vmin, cb.mappable.norm.vmax
    if mark is not None and np.isfinite(mark) and lo <= mark <= hi:
        cb.ax.axhline(mark, color="black", lw=2)
        label += "\n(black line: random baseline)"
    cb.set_label(label)
    return cb
