"""Head and layer tick labels never overprint one another, whatever the panel's drawn size (style.IndexTicks)."""

import io

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from qkinspect.report.grid import Grid
from qkinspect.report.heatmap import draw
from qkinspect.report.style import new_figure, style, symmetric_limit


def _labels(axis, renderer):
    return [t.get_window_extent(renderer) for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]


def _overlaps(boxes) -> bool:
    return any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


@pytest.mark.parametrize("panels", [1, 3, 5])
@pytest.mark.parametrize("n_heads, n_layers", [(12, 6), (32, 30), (9, 30), (64, 80)])
def test_tick_labels_never_overlap(panels, n_heads, n_layers):
    from matplotlib.colors import TwoSlopeNorm

    values = np.random.default_rng(0).normal(size=(n_layers, n_heads))
    grid = Grid("decoder", "x", list(range(n_layers)), list(range(n_heads)), values)
    lim = symmetric_limit(values, cap=None)
    with style():
        fig = new_figure(3.2)
        axes = fig.subplots(1, panels, squeeze=False)[0]
        for ax in axes:
            draw(ax, grid, TwoSlopeNorm(0.0, -lim, lim), annotate=False)
        FigureCanvasAgg(fig)
        fig.canvas.draw()  # a real drawing: the layout is final
        renderer = fig.canvas.get_renderer()
        for ax in axes:
            xs, ys = _labels(ax.xaxis, renderer), _labels(ax.yaxis, renderer)
            assert xs and ys
            assert not _overlaps(xs), [t.get_text() for t in ax.xaxis.get_ticklabels()]
            assert not _overlaps(ys), [t.get_text() for t in ax.yaxis.get_ticklabels()]
            shown = [int(t.get_text()) for t in ax.xaxis.get_ticklabels() if t.get_text()]
            assert shown[0] == 0 and len(set(np.diff(shown))) <= 1  # every k-th head from 0, evenly


def test_wide_panel_labels_every_head():
    from matplotlib.colors import Normalize

    grid = Grid("encoder", "x", [0, 1], list(range(12)), np.zeros((2, 12)))
    with style():
        fig = new_figure(3.0, 7.0)
        ax = fig.subplots()
        draw(ax, grid, Normalize(-1, 1), annotate=False)
        fig.savefig(io.BytesIO(), format="png", dpi=100)
    assert [t.get_text() for t in ax.xaxis.get_ticklabels()] == [str(h) for h in range(12)]
