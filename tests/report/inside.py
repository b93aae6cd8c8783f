"""Does every piece of text a figure draws lie inside its canvas? Lays the figure out on an Agg canvas (as savefig
and the PDF backend do) and compares each text artist's window extent with the figure's box."""

from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text

from qkinspect.report.style import style


def _tick_labels(fig) -> set[int]:
    """Tick labels: matplotlib keeps some outside the view limits, never drawn; each Axes' tight box holds the
    drawn ones, so they are checked through it."""
    out = set()
    for ax in fig.get_axes():
        for axis in (ax.xaxis, ax.yaxis):
            for tick in [*axis.majorTicks, *axis.minorTicks]:
                out.update({id(tick.label1), id(tick.label2)})
    return out


def texts_outside(fig, slack: float = 1.0) -> list[str]:
    """The texts of `fig` (titles, sub-figure titles, labels, legends, annotations, cell numbers, tick labels)
    whose drawn box crosses the figure's edge by more than `slack` pixels: [] when all lie inside."""
    root = fig.figure
    if root.canvas is None or not isinstance(root.canvas, FigureCanvasAgg):
        FigureCanvasAgg(root)
    with style():
        root.canvas.draw()
    renderer = root.canvas.get_renderer()
    box = root.bbox
    ticks = _tick_labels(root)
    found = []
    for t in root.findobj(Text):
        if id(t) in ticks or not t.get_visible() or not t.get_text().strip():
            continue
        found.append((t.get_text(), t.get_window_extent(renderer)))
    for ax in root.get_axes():
        if isinstance(ax, Axes) and ax.get_visible():
            found.append((f"axes {ax.get_label() or ax.get_title(loc='left')!r}", ax.get_tightbbox(renderer)))
    return [name for name, e in found if e is not None and (e.x0 < box.x0 - slack or e.x1 > box.x1 + slack
                                                            or e.y0 < box.y0 - slack or e.y1 > box.y1 + slack)]
