"""`qkinspect plot`: PNG, SVG and PDF files of the right size; one-line errors (exit 2) for bad input."""

from __future__ import annotations

import pytest

from qkinspect.report.style import DPI, WIDTH
from tests.report.png import ink_fraction, png_size


@pytest.mark.parametrize("kind", ["symmetry", "overlap", "spectra", "rank", "distribution", "heads"])
def test_plot_png(cli, llama_path, kind, tmp_path):
    out = tmp_path / f"{kind}.png"
    r = cli("plot", llama_path, "--kind", kind, "-o", out)
    assert r.exit_code == 0, r.stderr
    w, h = png_size(out)
    assert w == WIDTH * DPI and 2.5 * DPI <= h <= 9.5 * DPI
    assert ink_fraction(out) > 0.02
    assert f"wrote the {kind} figure" in r.stderr and r.stdout == ""


def test_plot_metric_computes_only_what_it_maps(cli, llama_path, tmp_path):
    """--kind metric with an opt-in metric: it is computed (the default selection would not have it)."""
    out = tmp_path / "shared.png"
    r = cli("plot", llama_path, "--kind", "metric", "--metric", "shared_qk_distance", "-o", out)
    assert r.exit_code == 0, r.stderr
    assert ink_fraction(out) > 0.02 and "wrote the shared_qk_distance figure" in r.stderr


def test_plot_heads_one_layer_svg(cli, bart_path, tmp_path):
    out = tmp_path / "heads.svg"
    r = cli("plot", bart_path, "--kind", "heads", "--layer", "1", "--block", "decoder", "-o", out)
    assert r.exit_code == 0, r.stderr
    svg = out.read_text()
    assert svg.lstrip().startswith("<?xml") and "decoder layer 1" in svg


def test_plot_compare_pdf(cli, llama_path, llama_b_path, tmp_path):
    out = tmp_path / "cmp.pdf"
    r = cli("plot", llama_path, "--kind", "compare", "--compare", llama_b_path, "-o", out)
    assert r.exit_code == 0, r.stderr
    assert out.read_bytes()[:5] == b"%PDF-"
    from pypdf import PdfReader

    assert len(PdfReader(out).pages) == 1


@pytest.mark.parametrize("args, message", [
    (["--kind", "pie", "-o", "x.png"], "'pie' is not one of"),
    (["-o", "x.jpg"], "plot writes .png, .svg, .pdf"),
    ([], "give -o"),
    (["--kind", "compare", "-o", "x.png"], "--compare MODEL_B"),
    (["--kind", "rank", "--layer", "1", "-o", "x.png"], "--layer applies to --kind heads"),
    (["--kind", "heads", "--layer", "9", "-o", "x.png"], "--layer: 9 is out of range; decoder has layers 0-1"),
    (["--kind", "metric", "-o", "x.png"], "--kind metric needs --metric NAME"),
    (["--metric", "symmetry", "-o", "x.png"], "--metric applies to --kind metric only"),
    (["--kind", "metric", "--metric", "symmetry_median", "-o", "x.png"], "not a per-head metric"),
])
def test_plot_refuses(cli, llama_path, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    r = cli("plot", llama_path, *args)
    assert r.exit_code == 2
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # nothing written, not even a temporary file


@pytest.mark.parametrize(("args", "line"), [
    (["--layers", "9"], "error: --layers: 9 is out of range; decoder has layers 0-1"),
    (["--block", "vision"], "error: --block vision: this model's blocks are decoder"),
])
def test_plot_composition_names_the_options_as_typed(cli, llama_path, tmp_path, args, line):
    """The composition a figure draws is checked in plot's option names (it once said `layers=9`)."""
    r = cli("plot", llama_path, "--kind", "composition", *args, "-o", tmp_path / "c.png")
    assert r.exit_code == 2 and r.stderr.strip().splitlines()[-1] == line, r.stderr
