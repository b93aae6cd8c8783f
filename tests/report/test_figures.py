"""Every figure kind for the demo model, a tiny GQA decoder and a tiny BART: PNG files of the figure's size,
with ink, a title naming the model, axis labels and a colour bar where colour carries a value."""

from __future__ import annotations

import numpy as np
import pytest

from qkinspect.errors import InputError
from qkinspect.report.analysis import figures
from qkinspect.report.style import DPI, PAGE, WIDTH, style
from tests.report import synthetic
from tests.report.png import expected_size, ink_fraction, png_size

MODELS = ("demo", "llama", "bart")
# colour encodes a value: a colour bar is due
COLOURED = {"symmetry", "overlap", "spectra", "heads", "compare", "metric"}


def _render(fig, path):
    with style():
        fig.savefig(path, format="png")
    return path


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("kind", figures.KINDS)
def test_every_kind_renders(results, model, kind, tmp_path):
    r = results[model]
    fig = figures.figure(r, kind, other=r if kind == "compare" else None,
                         metric_name="qk_stable_rank" if kind == "metric" else None)
    path = _render(fig, tmp_path / f"{kind}.png")
    w, h = png_size(path)
    assert (w, h) == expected_size(fig, DPI)
    assert w <= WIDTH * DPI and h <= (PAGE[1] - 1.5) * DPI  # fits a paper page's text area
    assert ink_fraction(path) > 0.02
    assert r.model.name in fig.get_suptitle()
    labelled = [ax for ax in fig.get_axes() if ax.get_xlabel() or ax.get_ylabel()]
    assert labelled or (fig.get_supxlabel() and fig.get_supylabel())
    colourbars = [ax for ax in fig.get_axes() if ax.get_label() == "<colorbar>"]
    assert bool(colourbars) == (kind in COLOURED)


def test_blocks_each_get_a_panel(results):
    fig = figures.figure(results["bart"], "symmetry")
    titles = " ".join(ax.get_title(loc="left") for ax in fig.get_axes())
    for block in ("encoder", "decoder", "cross"):
        assert f"{block}:" in titles


def test_heads_for_one_layer(results, tmp_path):
    r = results["llama"]
    fig = figures.figure(r, "heads", layer=1)
    assert "layer 1" in fig.get_suptitle()
    heat = [ax for ax in fig.get_axes() if ax.get_label() != "<colorbar>"]
    assert len(heat) == 1 and heat[0].images[0].get_array().shape == (4, 4)
    with pytest.raises(InputError, match="layer 7"):
        figures.figure(r, "heads", layer=7)


def test_compare_shows_b_minus_a(results):
    a, b = results["llama"], results["demo"]
    with pytest.raises(InputError, match="share no"):
        figures.figure(a, "compare", other=b)
    fig = figures.figure(a, "compare", other=a)
    img = fig.get_axes()[0].images[0].get_array()
    assert float(abs(img).max()) == 0.0  # a model against itself changes nothing


def test_many_heads_thin_the_ticks():
    r = synthetic.result(synthetic.block(n_layers=40, n_heads=64, d_model=512, d_head=8))
    for kind in ("symmetry", "overlap", "heads", "compare"):
        fig = figures.figure(r, kind, other=r)
        for ax in fig.get_axes():
            if ax.get_label() != "<colorbar>":
                assert len(ax.get_xticks()) <= 16 and len(ax.get_yticks()) <= 20, kind


def test_diverging_scale_is_centred_and_fitted():
    r = synthetic.result(synthetic.block())
    fig = figures.figure(r, "symmetry")
    norm = fig.get_axes()[0].images[0].norm
    assert norm.vcenter == 0 and norm.vmin == -norm.vmax <= 1
    assert norm.vmax >= max(abs(h.values["symmetry"]) for h in r.heads)


def test_unknown_kind_and_missing_metrics():
    r = synthetic.result(synthetic.block())
    with pytest.raises(InputError, match="unknown figure kind"):
        figures.figure(r, "pie")
    with pytest.raises(InputError, match="second model"):
        figures.figure(r, "compare")
    r.heads[:] = [type(h)(h.block, h.layer, h.head, h.kv_head, {"symmetry": 0.1}) for h in r.heads]
    with pytest.raises(InputError, match="qk_effective_rank"):
        figures.figure(r, "rank")


@pytest.mark.parametrize("name, centred", [("symmetry", True), ("directionality", True), ("overlap_kv", False),
                                           ("qk_stable_rank", False)])
def test_metric_heatmap_shows_the_metric(results, name, centred):
    """Each block's panel holds the metric's per-head values; signed metrics get a scale centred at 0."""
    from matplotlib.colors import TwoSlopeNorm

    from qkinspect.report.analysis.arrays import head_grid

    r = results["bart"]
    fig = figures.figure(r, "metric", metric_name=name)
    panels = [ax for ax in fig.get_axes() if ax.get_label() != "<colorbar>"]
    assert [ax.get_title(loc="left").split(":")[0] for ax in panels] == ["encoder", "decoder", "cross"]
    for ax, block in zip(panels, ("encoder", "decoder", "cross"), strict=True):
        want = head_grid(r, block, name).values
        got = np.ma.filled(np.ma.asarray(ax.images[0].get_array(), dtype=float), np.nan)  # masked cells: NaN
        np.testing.assert_allclose(got, want, equal_nan=True)
    norm = panels[0].images[0].norm
    assert isinstance(norm, TwoSlopeNorm) == centred
    if not centred:  # the scale spans the data, not the metric's whole range
        values = np.concatenate([head_grid(r, b, name).values.ravel() for b in ("encoder", "decoder", "cross")])
        assert (norm.vmin, norm.vmax) == pytest.approx((np.nanmin(values), np.nanmax(values)))
    from qkinspect.report.style import human_name

    assert human_name(name) in fig.get_suptitle() and "_" not in human_name(name)


def test_metric_heatmap_refuses(results):
    with pytest.raises(InputError, match="needs a metric name"):
        figures.figure(results["demo"], "metric")
    with pytest.raises(InputError, match="not a per-head metric"):
        figures.figure(results["demo"], "metric", metric_name="symmetry_median")
    with pytest.raises(InputError, match="ov_copying"):  # a head metric the analysis did not compute
        figures.figure(results["demo"], "metric", metric_name="ov_copying")


def _draw(fig):
    """Lay the figure out on an Agg canvas (as savefig does); returns the renderer."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    with style():
        canvas.draw()
    return canvas.get_renderer()


def _text_inside(fig) -> list[str]:
    """The drawn texts (titles, labels, tick labels, legends) that stick out of the figure: [] when all are inside.
    Each axes' tight box holds what it draws (tick labels outside the view limits are not drawn)."""
    renderer = _draw(fig)
    box = fig.bbox
    boxes = [(ax.get_label() or "axes", ax.get_tightbbox(renderer)) for ax in fig.get_axes()]
    for f in [fig, *fig.subfigs]:
        boxes += [(t.get_text(), t.get_window_extent(renderer)) for t in f.texts if t.get_text().strip()]
        boxes += [("legend", leg.get_window_extent(renderer)) for leg in f.legends]
        for t in (getattr(f, "_suptitle", None), getattr(f, "_supxlabel", None), getattr(f, "_supylabel", None)):
            if t is not None and t.get_text():
                boxes.append((t.get_text(), t.get_window_extent(renderer)))
    return [name for name, e in boxes if e is not None and (e.x0 < box.x0 - 1 or e.x1 > box.x1 + 1
                                                            or e.y0 < box.y0 - 1 or e.y1 > box.y1 + 1)]


@pytest.mark.parametrize("kind", figures.KINDS)
def test_every_label_and_title_lies_inside_the_figure(results, kind):
    r = results["bart"]
    fig = figures.figure(r, kind, other=r if kind == "compare" else None,
                         metric_name="qk_stable_rank" if kind == "metric" else None)
    assert _text_inside(fig) == []


def _tick_values(ax, axis="y"):
    _draw(ax.get_figure(root=True))
    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    ticks = ax.get_yticks() if axis == "y" else ax.get_xticks()
    return [t for t in ticks if lo <= t <= hi]


def test_head_counts_have_integer_ticks(results):
    fig = figures.figure(results["demo"], "distribution")
    for ax in fig.get_axes():
        ticks = _tick_values(ax)
        assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_heads_are_discrete_colours(results):
    """The spectra's colour bar has one step per head and integer ticks; lines take their head's step."""
    from matplotlib.colors import BoundaryNorm

    fig = figures.figure(results["demo"], "spectra")
    (bar,) = [ax for ax in fig.get_axes() if ax.get_label() == "<colorbar>"]
    ticks = _tick_values(bar)
    assert ticks and all(float(t).is_integer() for t in ticks) and max(ticks) <= 11
    assert isinstance(bar._colorbar.mappable.norm, BoundaryNorm)  # the Axes' own colour bar (matplotlib ≥ 3.6)


def test_small_multiples_leave_no_empty_cells(results):
    """Six layers are 2 × 3 panels, not 4 + 2 with two empty cells."""
    fig = figures.figure(results["demo"], "heads")
    panels = [ax for ax in fig.get_axes() if ax.get_label() != "<colorbar>"]
    assert len(panels) == 6 and all(ax.get_visible() for ax in panels)
    assert {ax.get_subplotspec().get_geometry()[:2] for ax in panels} == {(2, 3)}


def test_rank_label_sits_above_its_line(results):
    fig = figures.figure(results["demo"], "rank")
    renderer = _draw(fig)
    ax = fig.get_axes()[0]
    (label,) = [t for t in ax.texts if t.get_text().startswith("d_head")]
    line_y = ax.transData.transform((0, 32))[1]
    assert label.get_window_extent(renderer).y0 > line_y + 1


@pytest.mark.parametrize("kind", ["symmetry", "overlap"])
def test_a_library_figure_saves_at_the_documented_dpi_outside_the_style(kind, tmp_path):
    """`figure(result, kind).savefig(path)` with no style context writes DPI (200), as the CLI and docs say: the
    figure carries its dpi (it was 100, matplotlib's default)."""
    fig = figures.figure(synthetic.result(), kind)
    path = tmp_path / f"{kind}.png"
    fig.savefig(path)
    assert png_size(path) == expected_size(fig, DPI) and DPI == 200


def _panel_rows(fig) -> list[tuple[float, float]]:
    """(bottom, top) in inches of each row of visible panels (colour bars left out), top row first."""
    fig.canvas.draw()
    h = fig.get_size_inches()[1]
    rows = {}
    for ax in fig.axes:
        if ax.get_visible() and ax.get_label() != "<colorbar>":
            b = ax.get_position()
            rows[round(b.y0, 3)] = (b.y0 * h, b.y1 * h)
    return sorted(rows.values(), reverse=True)


@pytest.mark.parametrize("n_layers", [12, 18, 24, 30, 64])
def test_the_heads_figure_leaves_no_empty_band_between_rows(n_layers):
    """Rows of layers stand at most a title's height apart (18-30 layers left bands as tall as the panels: the
    figure's height was set by the row count, not by how wide the panels could be)."""
    r = synthetic.result(synthetic.block(n_layers=n_layers, n_heads=9, d_model=576, d_head=64), spectra=False)
    with style():
        rows = _panel_rows(figures.figure(r, "heads"))
    side = rows[0][1] - rows[0][0]
    assert side >= 0.4  # the panels were not shrunk to close the gaps
    gaps = [upper[0] - lower[1] for upper, lower in zip(rows, rows[1:], strict=False)]
    assert len(rows) >= 2 and max(gaps) <= 0.45, (side, gaps)  # inches: a panel title and its padding


def test_the_heads_colour_bar_marks_chance(results):
    """The heads figure's colour bar marks the chance overlap d_head / d_model, as `overlap` marks its random
    baseline: and that is the mean the random baseline of Q/K overlap measures."""
    r = results["llama"]
    spec = r.model.blocks[0]
    chance = spec.d_head / spec.d_model
    assert figures.heads_chance(r, spec.key) == chance
    base = r.baseline(spec.key, "overlap_qk")
    assert base is not None and abs(base.mean - chance) <= 4 * base.std / base.n ** 0.5 + 1e-3
    fig = figures.figure(r, "heads")
    bar = next(ax for ax in fig.axes if ax.get_label() == "<colorbar>")
    assert "random baseline" in bar.get_ylabel()
    assert any(list(line.get_ydata()) == [chance, chance] for line in bar.get_lines())
