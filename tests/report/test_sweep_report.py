"""The sweep report to the model report's standard: the model named on the cover, in the footer and the figure
titles; options in words, not Python values; a caption under every figure; page numbers; the q/k-norm caveat on
the cover and on the captions it concerns. And `plot SWEEP_DIR --kind symmetry` says what a sweep folder draws.
The sweep folder is written by qkinspect.track (no Dask needed)."""

from __future__ import annotations

import pytest
import torch

import qkinspect
from tests.cli.test_fold_qk_norm import save_qwen3
from tests.one_line import one_error_line


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A sweep folder of three steps of a tiny Qwen3 (q/k norms, measured raw) loaded from runs/tiny-qwen."""
    from transformers import AutoModel

    root = tmp_path_factory.mktemp("sweep")
    save_qwen3(root / "runs" / "tiny-qwen", seed=3)
    model = AutoModel.from_pretrained(root / "runs" / "tiny-qwen")
    out = root / "qk"
    for step in (10, 20, 30):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * torch.randn_like(p))
        qkinspect.track(model, step, out, metrics=["symmetry", "overlap_qk"])
    return out


def _pages(path) -> list[str]:
    from pypdf import PdfReader

    return [" ".join(p.extract_text().split()) for p in PdfReader(path).pages]


def test_the_sweep_report_names_the_model_and_captions_every_figure(swept, cli, tmp_path):
    out = tmp_path / "s.pdf"
    r = cli("report", swept, "-o", out)
    assert r.exit_code == 0, r.stderr
    pages = _pages(out)
    assert len(pages) == 3  # the cover, symmetry, overlap_qk
    for i, text in enumerate(pages, start=1):  # the footer and the page's number, as the model report's
        assert text.endswith(f"sweep report: tiny-qwen {i}"), text[-80:]
    cover = pages[0]
    assert "qkinspect sweep report tiny-qwen" in cover and "model tiny-qwen" in cover
    assert "metrics symmetry, overlap_qk" in cover and "fold qk norm no" in cover
    assert not any(s in cover for s in ("['", "('", "False", "None"))  # no Python values
    assert "Not what attention computes" in cover  # the q/k-norm notice, as on the model report's cover
    symmetry, overlap = pages[1], pages[2]
    assert "tiny-qwen (3 checkpoints)" in symmetry  # the figure's title names the model
    assert symmetry.count("q/k-norm gains not folded in") == 2  # in the figure's title and in its caption
    assert "Thick lines: per layer, the median over its heads" in symmetry and "Range [-1, 1]" in symmetry
    assert "q/k-norm gains not folded in" in symmetry  # the caveat on the caption it concerns...
    assert "Thick lines" in overlap and "q/k-norm gains not folded in" not in overlap  # ...not on column spaces


def test_the_html_sweep_report_has_the_same_captions(swept, cli, tmp_path):
    out = tmp_path / "s.html"
    r = cli("report", swept, "--html", "-o", out)
    assert r.exit_code == 0, r.stderr
    page = out.read_text()
    assert "model: tiny-qwen" in page and page.count("<figcaption>Symmetry score of every head") == 1
    assert "[&#x27;" not in page and "metrics symmetry, overlap_qk" in page


@pytest.mark.parametrize("kind", ["symmetry", "overlap", "heads"])
def test_plot_of_a_sweep_folder_says_what_it_draws(swept, cli, tmp_path, kind):
    """It said "no config.json in this folder"."""
    out = tmp_path / "x.png"
    line = one_error_line(cli("plot", swept, "--kind", kind, "-o", out), str(swept), "a sweep folder draws "
                          "--kind trajectory --metric NAME", "symmetry", f"for --kind {kind}", "qkinspect report")
    assert "config.json" not in line and not out.exists()
    r = cli("plot", swept, "--kind", "trajectory", "--metric", "overlap_qk", "-o", out)
    assert r.exit_code == 0, r.stderr


def test_a_titled_trajectory_keeps_the_caveat(swept, tmp_path):
    """`plot SWEEP --kind trajectory --title T`: the title replaced, the q/k-norm caveat kept under it."""
    from qkinspect.report.sweep.trajectory import sweep_trajectory
    from qkinspect.sweep import read_sweep

    fig = sweep_trajectory(read_sweep(swept), "symmetry", title="Tiny Qwen over training")
    title = " ".join(fig.get_suptitle().split())
    assert title.startswith("Tiny Qwen over training") and "q/k-norm gains not folded in" in title
    assert "q/k-norm" not in sweep_trajectory(read_sweep(swept), "overlap_qk").get_suptitle()
