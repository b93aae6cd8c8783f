"""The atlas's statistics on hand-made numbers, and its figures and table with 2 and with 40 models (synthetic
entries: analysis documents of made-up models, summarised by the atlas's own statistics)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qkinspect.atlas.stats import attention_params, depth, entry_stats, quartiles
from tests.atlas.synthetic import synthetic_atlas, synthetic_doc


def test_depth_is_l_over_l_minus_1_and_a_single_layer_sits_in_the_middle():
    assert [depth(i, 5) for i in range(5)] == [0, 0.25, 0.5, 0.75, 1]
    assert depth(0, 1) == 0.5


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.floats(-1, 1), st.just(math.nan)), min_size=1, max_size=40))
def test_quartiles_leave_undefined_heads_out(values):
    median, q1, q3, n = quartiles(values)
    finite = sorted(v for v in values if math.isfinite(v))
    assert n == len(finite)
    if not finite:
        assert median is None
        return
    k = len(finite)
    assert median == pytest.approx((finite[(k - 1) // 2] + finite[k // 2]) / 2, abs=1e-12)
    assert finite[0] <= q1 <= median <= q3 <= finite[-1]


def test_a_one_layer_block_and_an_undefined_metric():
    doc = {"model": {"model_type": "x", "format": "gguf", "blocks": [
        {"name": "decoder", "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "d_model": 8, "d_head": 4}]},
        "heads": [{"block": "decoder", "layer": 0, "head": h, "kv_head": 0, "symmetry": 0.1 * h, "bias_q_norm": None}
                  for h in range(2)],
        "layers": [{"block": "decoder", "layer": 0, "n_heads": 2, "symmetry_layer": 0.3}]}
    records, facts = entry_stats("m", doc)
    assert {r.metric for r in records} == {"symmetry", "symmetry_layer"}  # no finite bias: no records
    layer = [r for r in records if r.scope == "layer"]
    assert {r.depth for r in layer} == {0.5}
    assert next(r for r in layer if r.metric == "symmetry_layer").n == 1
    assert facts[0]["attention_params"] == 2 * 8 * 4 + 1 * 8 * 4 * 2 + 2 * 4 * 8
    # a cross-attention block reading a wider encoder, and weights shared by every layer
    assert attention_params({"n_layers": 6, "n_heads": 2, "n_kv_heads": 2, "d_model": 8, "d_model_kv": 16,
                             "d_head": 4, "shared_layers": True}) == 2 * 8 * 4 + 2 * 16 * 4 * 2 + 2 * 4 * 8


@pytest.mark.parametrize("n", [2, 40])
def test_figures_with_2_and_40_models(n, tmp_path):
    from qkinspect.report.atlas.figures import depth_figure, size_figure
    from qkinspect.report.style import style

    atlas = synthetic_atlas(n)
    kinds = {f["kind"] for f in atlas.facts}
    fig = depth_figure(atlas, "symmetry")
    axes = [ax for ax in fig.axes if ax.get_title(loc="left")]
    assert len(axes) == len(kinds)
    many = [(f["model"], f["block"]) for f in atlas.facts if f["layers"] > 1]
    # a line per model and block of several layers (one point with its bar for one layer), colours by model
    assert sum(len(ax.get_lines()) for ax in axes) >= len(many)
    assert sum(len(ax.collections) for ax in axes) >= len(many)  # the quartile bands
    legend = fig.legends[0]
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels[:n] == atlas.models and set(labels[n:]) <= {"encoder self-attention", "decoder self-attention",
                                                               "cross-attention"}
    size = size_figure(atlas, "symmetry_layer")
    assert size.axes[0].get_xscale() == "log"
    with style():
        for name, f in (("depth", fig), ("size", size)):
            f.savefig(tmp_path / f"{name}{n}.png", dpi=60)
            assert (tmp_path / f"{name}{n}.png").stat().st_size > 5000
        # nothing of the legend lies under the panels: it is beside them
        fig.canvas.draw()
        box = legend.get_window_extent()
        assert all(box.x0 >= ax.get_window_extent().x1 for ax in axes)


@pytest.mark.parametrize("n", [2, 40])
def test_the_table_fits_80_columns_and_cuts_nothing(n):
    from rich.console import Console

    from qkinspect.terminal.atlas import atlas_tables

    atlas = synthetic_atlas(n)
    tables, lines = atlas_tables(atlas.rows(), width=80)
    console = Console(width=80, record=True, color_system=None)
    for t in tables:
        console.print(t)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    for row in atlas.rows():
        assert f"{row['symmetry']:.3f}" in text or f"{row['symmetry']:.3f}" == "-0.000"
    assert len([line for line in text.splitlines() if " encoder " in f" {line} " or " decoder " in line
                or " cross " in line]) >= len(atlas.facts)
    # names too long for a quarter of the width are numbered, and the numbers spelt out
    assert any(line.startswith("models: 1=") for line in lines) == (max(map(len, atlas.models)) > 20) == (n == 40)


def test_synthetic_documents_are_what_analyze_writes():
    """The synthetic entries carry the fields the records come from (so the figure tests draw real records)."""
    doc = synthetic_doc(3, np.random.default_rng(1))
    records, facts = entry_stats("m", doc)
    assert {r.metric for r in records} == {"symmetry", "overlap_qk", "symmetry_layer"}
    assert len(facts) == len(doc["model"]["blocks"])


def test_two_towers_of_one_kind_are_told_apart():
    """A CLIP-like model (text and vision encoders): two lines of one colour in the encoder panel, the second
    marked, each named in the legend."""
    from qkinspect.atlas import AtlasResult
    from qkinspect.report.atlas.figures import depth_figure

    blocks = [{"name": "encoder", "label": tower, "n_layers": 3, "n_heads": 2, "n_kv_heads": 2, "d_model": 8,
               "d_head": 4} for tower in ("text", "vision")]
    heads = [{"block": b["label"], "layer": layer, "head": h, "kv_head": h, "symmetry": 0.1 * layer + h}
             for b in blocks for layer in range(3) for h in range(2)]
    doc = {"model": {"model_type": "clip", "format": "safetensors", "blocks": blocks}, "heads": heads, "layers": []}
    records, facts = entry_stats("clip", doc)
    assert [(f["block"], f["kind"]) for f in facts] == [("text", "encoder"), ("vision", "encoder")]
    atlas = AtlasResult(Path("towers"), {}, ["clip"], records, facts)
    fig = depth_figure(atlas, "symmetry")
    (ax,) = [a for a in fig.axes if a.get_title(loc="left")]
    assert [line.get_marker() for line in ax.get_lines()] == ["None", "o"]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["clip", "clip [vision]"]


@pytest.mark.parametrize("n", [3, 40])
def test_the_report_captions_every_figure_and_its_legends_are_readable(n, tmp_path):
    """Issue 39: the atlas report had no captions and legends near 5 pt; now each figure is on a page with its caption
    (as the model report's), legends at 7 pt at least, chance levels and raw q/k-norm models said."""
    pypdf = pytest.importorskip("pypdf")
    from qkinspect.report.atlas.figures import depth_figure, size_figure
    from qkinspect.report.atlas.pdf import write_atlas_pdf

    atlas = synthetic_atlas(n)
    atlas.facts[1]["qk_norm_raw"] = True
    atlas.records = [replace(r, chance=0.125) if r.metric == "overlap_qk" else r for r in atlas.records]
    for fig in (depth_figure(atlas, "overlap_qk"), size_figure(atlas, "symmetry_layer")):
        assert min(t.get_fontsize() for t in fig.legends[0].get_texts()) >= 7
    pages = write_atlas_pdf(atlas, tmp_path / "a.pdf")
    texts = [p.extract_text().replace("\n", " ") for p in pypdf.PdfReader(tmp_path / "a.pdf").pages]
    assert len(texts) == pages
    figures = texts[1:]
    assert all("against depth" not in t or "normalised depth l / (L − 1) of each block's own" in t for t in figures)
    assert all("attention parameters (W_Q, W_K, W_V, W_O of every block, log scale)" in t for t in figures[-2:])
    overlap = next(t for t in figures if "overlap_qk against depth" in t)
    assert "each model's chance level" in overlap
    symmetry = next(t for t in figures if "symmetry against depth" in t)
    assert f"Measured raw, q/k-norm gains not folded in: {atlas.facts[1]['model']}" in symmetry
    assert "(measured raw, not folded)" in texts[0]
    if n == 3:  # the HTML report has the same captions
        from qkinspect.report.atlas.html import render_atlas_html

        page = render_atlas_html(atlas)
        assert page.count("<figcaption>") == pages - 1 and "each model&#x27;s chance level" in page
        assert "(q/k norm raw)" in page and "overlap by chance" in page


def test_the_layer_form_subtitle_is_math_not_source_text():
    """The subtitle read `Σ_h W_Q^h W_K^{h//rep}ᵀ` verbatim; it is mathtext now, and says what g(h) is."""
    from qkinspect.report.atlas.figures import depth_figure

    title = depth_figure(synthetic_atlas(2), "symmetry_layer").get_suptitle()
    assert "{h//rep}" not in title and "$\\Sigma_h" in title.replace("\n", "") and "g(h) = h //" in title
