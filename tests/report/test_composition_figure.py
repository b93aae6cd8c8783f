"""The composition figure (`plot --kind composition`, from a model or a saved document) and the report's composition
section (`report --composition`), with their bad inputs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers as tf
from typer.testing import CliRunner

import qkinspect
from qkinspect.cli.app import app
from qkinspect.report.composition.figures import composition_figure, head_grid, layer_grid
from qkinspect.report.style import style
from tests.one_line import one_error_line


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)
    path = tmp_path_factory.mktemp("llama")
    tf.LlamaModel(cfg).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def saved(llama, tmp_path_factory):
    out = tmp_path_factory.mktemp("c") / "c.json"
    r = run("composition", llama, "-o", out)
    assert r.exit_code == 0, r.stderr
    return out


def test_grids_hold_the_ratios_in_layer_order(llama):
    r = qkinspect.composition(str(llama))
    g = layer_grid(r, "q")  # earlier layers 0, 1 x later layers 1, 2
    assert g.shape == (2, 2) and np.isnan(g[1, 0])
    s = r.scores[("decoder", 0, "decoder", 2, "q")]
    assert g[0, 1] == pytest.approx(np.sqrt(np.mean(s**2)) * 32 ** 0.5)
    h, rows, cols = head_grid(r, "v")
    assert h.shape == (8, 8) and rows == [0, 4] and cols == [0, 4]
    np.testing.assert_allclose(h[4:, 4:], r.scores[("decoder", 1, "decoder", 2, "v")] * 32 ** 0.5)
    assert np.isnan(h[4:, :4]).all()


def test_encoder_decoder_figure_draws():
    torch.manual_seed(0)
    cfg = tf.BartConfig(vocab_size=40, d_model=24, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                        decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=16)
    r = qkinspect.composition(tf.BartModel(cfg), fold_ln=False)
    with style():
        fig = composition_figure(r)
    assert len(fig.axes) == 7  # 2 x 3 panels and the colour bar
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[0] == "E0" and "D0" in labels and "C0" in labels


@pytest.mark.parametrize("source", ["model", "saved"])
def test_plot_kind_composition(llama, saved, tmp_path, source):
    out = tmp_path / "c.png"
    r = run("plot", llama if source == "model" else saved, "--kind", "composition", "-o", out)
    assert r.exit_code == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_refuses_analysis_options_on_a_saved_document(saved, tmp_path):
    one_error_line(run("plot", saved, "--kind", "composition", "--layers", "1", "-o", tmp_path / "c.png"),
                   "saved composition")
    assert not (tmp_path / "c.png").exists()


def test_report_with_a_composition_section(llama, saved, tmp_path):
    with_section, without = tmp_path / "a.pdf", tmp_path / "b.pdf"
    assert run("report", llama, "--composition", saved, "-o", with_section).exit_code == 0
    assert run("report", llama, "-o", without).exit_code == 0
    text = with_section.read_bytes()
    assert text.startswith(b"%PDF") and with_section.stat().st_size > without.stat().st_size


@pytest.mark.parametrize("make,says", [
    (lambda p: p.write_text("{not json"), "a composition document is not valid JSON"),
    (lambda p: p.write_text("[" * 100 + "]" * 100), "nested more than 64 levels"),  # read as every document is
    (lambda p: p.write_text(json.dumps({"schema": "qkinspect/1", "kind": "analyze"})), "not a valid composition"),
])
def test_report_refuses_a_bad_composition_document(llama, tmp_path, make, says):
    bad = tmp_path / "bad.json"
    make(bad)
    one_error_line(run("report", llama, "--composition", bad, "-o", tmp_path / "r.pdf"), "bad.json", says)
    assert not (tmp_path / "r.pdf").exists()


def test_report_composition_is_pdf_only(llama, saved, tmp_path):
    one_error_line(run("report", llama, "--composition", saved, "--html", "-o", tmp_path / "r.html"),
                   "--composition", "PDF report only")


def test_ratios_past_the_colour_scale_are_marked(llama):
    """Issue 39: the scale stops at the 0.999 quantile (2.4 on SmolLM2) while the top pair was 5.4, with no mark:
    the colour bar now ends in an arrow where ratios lie above it, and says how far they go."""
    r = qkinspect.composition(str(llama))
    key = ("decoder", 0, "decoder", 2, "k")
    r.scores[key][0, 0] = 40 * r.baseline("decoder", "decoder")  # one pair far above every other
    with style():
        fig = composition_figure(r)
    (cb,) = [im.colorbar for ax in fig.axes for im in ax.images if im.colorbar is not None]
    assert cb.extend == "max" and "up to 40.00" in cb.ax.get_ylabel()
    cmap = fig.axes[0].images[0].get_cmap()
    assert cmap.get_over()[:3] == pytest.approx(cmap(1.0)[:3])  # past the top: the top colour, not white
