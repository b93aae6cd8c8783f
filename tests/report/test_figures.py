"""Every figure kind for the demo model, a tiny GQA decoder and a tiny BART: PNG files of the figure's size,
with ink, a title naming the model, axis labels and a colour bar where colour carries a value."""

from __future__ import annotations

import numpy as np
import pytest

from qkinspect.errors import InputError
from qkinspect.report import figures
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

    from qkinspect.report.grid import head_grid

    r = results["bart"]
    fig = figures.figure(r, "metric", metric_name=name)
    panels = [ax for ax in fig.get_axes() if ax.get_label() != "<colorbar>"]
    assert [ax.get_title(loc="left").split(":")[0] for ax in panels] == ["encoder", "decoder", "cross"]
    for ax, block in zip(panels, ("encoder", "decoder", "cross"), strict=True):
        want = head_grid(r, block, name).values
        got = np.ma.filled(np.ma.asarray(ax.images[0].get_array(), dtype=float), np.nan)  # masked cells: NaN
        np.testing.assert_allclose(got, want, equal_nan=True)
    assert isinstance(panels[0].images[0].norm, TwoSlopeNorm) == centred
    assert name in fig.get_suptitle()


def test_metric_heatmap_refuses(results):
    with pytest.raises(InputError, match="needs a metric name"):
        figures.figure(results["demo"], "metric")
    with pytest.raises(InputError, match="not a per-head metric"):
        figures.figure(results["demo"], "metric", metric_name="symmetry_median")
    with pytest.raises(InputError, match="ov_copying"):  # a head metric the analysis did not compute
        figures.figure(results["demo"], "metric", metric_name="ov_copying")
