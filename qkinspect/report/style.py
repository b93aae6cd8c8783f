"""One look for every figure and page: headless matplotlib (Agg, no pyplot), paper-size figures, shared
colour maps, tick thinning and the one number format the report uses."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # headless: never needs a display; we build Figures directly and never import pyplot

import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

# Sizes in inches. 7 in is a full text width in most paper templates; A4 pages for the PDF report.
WIDTH = 7.0
PAGE = (8.27, 11.69)
DPI = 200

DIVERGING = "RdBu_r"  # signed quantities (symmetry, changes): white at 0, red positive, blue negative
SEQUENTIAL = "viridis"  # [0, 1] quantities (subspace overlap)
HEADS_CMAP = "viridis"  # colour = head index in spectra plots
MISSING = "#d9d9d9"  # cells with no value (NaN, heads not analysed)

DECIMALS = 3
NUMBER_NOTE = f"Numbers are rounded to {DECIMALS} decimals, as the qkinspect CLI prints them."

RC = {
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.titlesize": 9.5,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "figure.titlesize": 11,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": False,
    "grid.alpha": 0.3,
    "image.interpolation": "nearest",
    "savefig.dpi": DPI,
    "pdf.fonttype": 42,  # TrueType, so text in PDFs stays searchable and selectable
    "svg.fonttype": "none",  # text stays text in SVG
}


@contextmanager
def style() -> Iterator[None]:
    """Apply the report style while building and saving figures.

    Example:
        >>> with style():
        ...     fig = new_figure(2.0)
    """
    with matplotlib.rc_context(RC):
        yield


def new_figure(height: float, width: float = WIDTH) -> Figure:
    """A figure of the given size with constrained layout (labels never overlap; size stays fixed), at DPI: its
    own `savefig` writes DPI outside `style()` too (matplotlib's default savefig.dpi is the figure's)."""
    return Figure(figsize=(width, height), layout="constrained", dpi=DPI)


# Makes the surface a figure draws on from the height (and width) it asks for: `new_figure` for a file of its own,
# a SubFigure of an A4 page in the PDF report.
Canvas = Callable[..., Any]


def fmt(x: float | None) -> str:
    """Format a number the way the whole report (and the terminal's tables) does: 3 decimals (4 significant digits from
    1000 up), 'n/a' where undefined.

    Example:
        >>> fmt(0.12345), fmt(float("nan"))
        ('0.123', 'n/a')
    """
    if x is None or not math.isfinite(float(x)):
        return "n/a"
    x = float(x)
    return f"{x:.{DECIMALS}f}" if abs(x) < 1000 else f"{x:.4g}"


def count_text(x: float | None) -> str:
    """A median of whole counts (dimensions, heads): whole, or the two counts it lies between ("65–66" for the
    median 65.5 of an even number of heads); any other value as `fmt` writes it.

    Example:
        >>> count_text(65.0), count_text(65.5), count_text(float("nan"))
        ('65', '65–66', 'n/a')
    """
    if x is None or not math.isfinite(float(x)):
        return "n/a"
    x = float(x)
    if x.is_integer():
        return str(int(x))
    if (2 * x).is_integer():
        return f"{math.floor(x)}–{math.ceil(x)}"
    return fmt(x)


def tick_step(n: int, max_ticks: int = 16) -> int:
    """Label every k-th of n categories so at most `max_ticks` labels show (1, 2, 4, 8 ... for regular grids)."""
    step = 1
    while math.ceil(n / step) > max_ticks:
        step *= 2
    return step


def panel_grid(n: int, max_cols: int) -> tuple[int, int]:
    """(rows, cols) for n small panels at paper width, about 3:2 wide (√(1.6 n) columns, at most `max_cols`),
    trading each empty cell against one column away from that shape.

    Example:
        >>> panel_grid(6, 4), panel_grid(30, 8), panel_grid(7, 4)
        ((2, 3), (5, 6), (2, 4))
    """
    if n <= 1:
        return 1, 1
    target = math.sqrt(1.6 * n)
    cols = min(range(1, min(n, max_cols) + 1), key=lambda c: (-(-n // c) * c - n) + abs(c - target))
    return -(-n // cols), cols


def integer_ticks(ax, axis: str = "y") -> None:
    """Only whole-number ticks on `axis` (counts: a histogram's number of heads)."""
    from matplotlib.ticker import MaxNLocator

    (ax.yaxis if axis == "y" else ax.xaxis).set_major_locator(MaxNLocator(integer=True))


HUMAN_NAMES = {
    "symmetry": "symmetry score", "directionality": "directionality", "qk_effective_rank": "effective rank",
    "qk_stable_rank": "stable rank", "qk_participation_ratio": "participation ratio", "qk_k90": "k90",
    "qk_eig_pos_frac": "fraction of positive eigenvalues", "qk_eig_real_ratio": "real part of the eigenvalues",
    "shared_qk_distance": "distance to a shared query/key matrix", "overlap_qk": "Q/K subspace overlap",
    "overlap_qv": "Q/V subspace overlap", "overlap_kv": "K/V subspace overlap", "cosine_qk": "cosine of W_Q and W_K",
    "cosine_qv": "cosine of W_Q and W_V", "cosine_kv": "cosine of W_K and W_V", "cka_qk": "CKA of W_Q and W_K",
    "cka_qv": "CKA of W_Q and W_V", "cka_kv": "CKA of W_K and W_V", "ov_copying": "OV copying score",
    "ov_effective_rank": "effective rank of W_V W_O", "ov_norm_spec": "spectral norm of W_V W_O",
}


def human_name(metric: str) -> str:
    """A metric's name for axis labels and titles: 'qk_stable_rank' -> 'stable rank'; norms spelled out."""
    if metric in HUMAN_NAMES:
        return HUMAN_NAMES[metric]
    parts = metric.split("_")
    if parts[0] in ("norm", "bias") and len(parts) >= 3:
        kind = {"fro": "Frobenius norm", "spec": "spectral norm", "norm": "norm"}.get(parts[-1], parts[-1])
        what = "W_" + parts[1].upper() if parts[1] != "qk" else "W_Q W_Kᵀ"
        return f"{kind} of {'b_' + parts[1].upper() if parts[0] == 'bias' else what}"
    return metric.replace("_", " ")


def set_index_ticks(ax, n: int, axis: str, labels: list[int] | None = None, max_ticks: int = 16) -> None:
    """Integer category ticks (heads, layers): at most `max_ticks` labels, and thinned further, each time the figure
    is drawn, until the labels fit the axis at its drawn size (IndexTicks): neighbouring labels never overprint."""
    from matplotlib.ticker import FuncFormatter

    labels = list(range(n)) if labels is None else list(labels)
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_locator(IndexTicks(n, max(len(str(x)) for x in labels) if labels else 1, max_ticks))
    target.set_major_formatter(FuncFormatter(
        lambda v, _pos: str(labels[int(round(v))]) if 0 <= round(v) < n and abs(v - round(v)) < 1e-9 else ""))


class IndexTicks(matplotlib.ticker.Locator):
    """Ticks for n categories at 0..n-1: every k-th (k = 1, 2, 4, …), the smallest k whose labels (`chars` digits
    wide, at the axis' tick-label size) fit the axis length as drawn, and at most `max_ticks` of them."""

    GAP = 0.6  # room between neighbouring labels, in character widths

    def __init__(self, n: int, chars: int, max_ticks: int):
        self.n, self.chars, self.max_ticks = n, chars, max_ticks

    def __call__(self):
        return self.tick_values(0, self.n - 1)

    def tick_values(self, vmin, vmax):
        from matplotlib.font_manager import FontProperties

        n, step, axis = self.n, tick_step(self.n, self.max_ticks), self.axis
        if axis is not None and axis.axes is not None and n > 1:
            ax = axis.axes
            horizontal = axis is ax.xaxis
            length = (ax.bbox.width if horizontal else ax.bbox.height) * 72 / ax.figure.dpi  # points, as drawn
            size = FontProperties(size=matplotlib.rcParams["xtick.labelsize" if horizontal else "ytick.labelsize"])
            pt = size.get_size_in_points()
            need = pt * (0.6 * self.chars + self.GAP) if horizontal else pt * 1.4  # points per label
            while step < n and math.ceil(n / step) * need > length:
                step *= 2
        return list(range(0, n, step))


def symmetric_limit(values, floor: float = 0.05, cap: float | None = 1.0) -> float:
    """Half-width of a colour scale centred at 0 that fits the data: max |value| rounded up, never below `floor`,
    never above `cap`. A fixed [-1, 1] scale would wash out a model whose scores all lie within ±0.2.

    Example:
        >>> symmetric_limit([0.13, -0.02])
        0.15
    """
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    top = max(floor, nice_ceil(float(np.abs(v).max()))) if v.size else 1.0
    return top if cap is None else min(cap, top)


def nice_ceil(x: float) -> float:
    """Round up to a round number: 1, 1.5, 2, 2.5, 3, 4, 5, 6, 8 times a power of ten (0.13 -> 0.15, 0.62 -> 0.8)."""
    if not x > 0:
        return 0.0
    p = 10 ** math.floor(math.log10(x))
    for m in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if x <= m * p * (1 + 1e-9):
            return round(m * p, 12)
    return 10 * p


def colours(n: int) -> list:
    """n distinguishable colours (the models of an atlas, the arms of a twin): tab10 up to 10, else tab20, tab20b
    and tab20c (60), then repeated."""
    if n <= 10:
        return [matplotlib.colormaps["tab10"](i) for i in range(n)]
    pool = [matplotlib.colormaps[m](i) for m in ("tab20", "tab20b", "tab20c") for i in range(20)]
    return [pool[i % len(pool)] for i in range(n)]
