"""Titles fit their canvas, whatever the model is called: every figure kind, the experiment and trajectory
figures, and every page of the PDF report keep every text artist inside the figure, in PNG and in the PDF."""

from __future__ import annotations

import io

import pytest

from qkinspect.report.analysis import figures
from qkinspect.report.style import style
from qkinspect.report.titles import fit, retitle
from tests.report import synthetic
from tests.report.inside import texts_outside

# a path with no spaces (breaks at separators) and a name of many words
LONG_NAMES = ("/home/someone/checkpoints/HuggingFaceTB--SmolLM2-135M-Instruct/snapshots/q8_0/smollm2-135m.gguf",
              "sentence-transformers all-MiniLM-L6-v2 fine-tuned on a very long list of tasks " * 3,
              "Q" * 150)  # no separator at all: broken between characters


def _result(name: str):
    return synthetic.result(synthetic.block("encoder", n_layers=3, n_heads=6),
                            synthetic.block("decoder", n_layers=4, n_heads=4, d_head=16), name=name)


def _kind_figure(r, kind: str, title: str | None = None):
    return figures.figure(r, kind, other=r if kind == "compare" else None, title=title,
                          metric_name="shared_qk_distance" if kind == "metric" else None)


@pytest.fixture(scope="module")
def long_results():
    rs = []
    for name in LONG_NAMES:
        r = _result(name)
        for h in r.heads:  # the metric figure's title carries a gauge note: make it the longest title
            h.values.__setitem__("shared_qk_distance", 0.5)  # type: ignore[index]
        rs.append(r)
    return rs


@pytest.mark.parametrize("kind", figures.KINDS)
def test_every_kind_keeps_its_text_inside_with_a_long_name(long_results, kind, tmp_path):
    for r in long_results:
        fig = _kind_figure(r, kind)
        assert texts_outside(fig) == [], (kind, r.model.name[:20])
        title = fig.get_suptitle()
        assert r.model.name.replace(" ", "")[:10] in title.replace("\n", "").replace(" ", "")
        with style():
            fig.savefig(tmp_path / f"{kind}.png", format="png")


def test_a_given_title_replaces_the_model_name_and_fits(long_results):
    r = long_results[0]
    fig = _kind_figure(r, "symmetry", title="SmolLM2-135M: how symmetric " * 8)
    assert "checkpoints" not in fig.get_suptitle() and fig.get_suptitle().startswith("Smol")
    assert texts_outside(fig) == []


def test_fit_wraps_breaks_and_shortens():
    assert fit("short title", 5.0, 11) == "short title"
    lines = fit("a/b/" + "c" * 300, 2.0, 11).split("\n")
    assert len(lines) == 3 and lines[0] == "a/b/" and lines[-1].endswith("…")
    assert fit("one\ntwo", 5.0, 11) == "one\ntwo"
    named = fit("x" * 400 + ": symmetry of W_Q W_Kᵀ per head", 3.0, 11)  # the name gives way, not what is shown
    assert named.endswith("…: symmetry of W_Q W_Kᵀ per head") and named.count("\n") == 2
    from qkinspect.report.pages import text_width

    for line in fit(" ".join(["word"] * 60), 1.5, 11).split("\n"):
        assert text_width(line, 11) <= 1.5


def test_experiment_and_trajectory_figures(tmp_path):
    from qkinspect.experiment.saved import check_experiment
    from qkinspect.report.experiment.figure import experiment_figure
    from qkinspect.report.sweep.trajectory import trajectory
    from tests.experiment.test_plot_experiment import synthetic as runs

    doc = runs()
    doc["model"]["name"] = LONG_NAMES[0]
    result = check_experiment(doc, "runs.json")
    assert texts_outside(experiment_figure(result)) == []
    assert texts_outside(retitle(experiment_figure(result), LONG_NAMES[1])) == []
    rows = [{"checkpoint": f"c{s}", "step": s, "block": "encoder", "layer": i, "head": h, "symmetry": 0.1 * s}
            for s in range(3) for i in range(2) for h in range(2)]
    assert texts_outside(trajectory(rows, "symmetry", name=LONG_NAMES[0])) == []


@pytest.mark.parametrize("which", [1, 2])
def test_every_pdf_page_keeps_its_text_inside(long_results, monkeypatch, which):
    """Each page the report writes (text pages and figure pages) is checked as the PDF backend receives it."""
    from matplotlib.backends import backend_pdf

    import qkinspect.report.analysis.pdf as pdf_mod

    bad: list[tuple[int, list[str]]] = []

    class Checked(backend_pdf.PdfPages):
        def savefig(self, figure=None, **kw):
            bad.append((self.get_pagecount() + 1, texts_outside(figure)))
            return super().savefig(figure, **kw)

    monkeypatch.setattr(backend_pdf, "PdfPages", Checked)  # report_pdf (report/pages.py) imports it as it writes
    n = pdf_mod.write_pdf(long_results[which], io.BytesIO())
    assert len(bad) == n > 5
    assert [b for b in bad if b[1]] == []


def test_plot_and_report_take_a_title(cli, llama_path, tmp_path):
    """`--title` on the command line: the figure's title, and the report's title, footer and figure titles."""
    from pypdf import PdfReader

    out = tmp_path / "s.svg"
    r = cli("plot", llama_path, "--kind", "rank", "--title", "Tiny Llama: ranks", "-o", out)
    assert r.exit_code == 0, r.stderr
    assert "Tiny Llama: ranks" in out.read_text() and llama_path.name not in out.read_text()
    pdf = tmp_path / "r.pdf"
    r = cli("report", llama_path, "--title", "Tiny Llama", "-o", pdf)
    assert r.exit_code == 0, r.stderr
    pages = [p.extract_text() for p in PdfReader(pdf).pages]
    assert "Tiny Llama" in pages[0] and str(llama_path) in pages[0].replace("\n", "")  # identity kept
    assert all("report: Tiny Llama" in p for p in pages)  # the footer
    assert any("Tiny Llama: symmetry of W" in p for p in pages)  # a figure's title


def _sweep(long: str):
    """A sweep folder's contents, built in memory: three checkpoints with long names of a synthetic model."""
    from qkinspect.sweep.checkpoints import Checkpoint
    from qkinspect.sweep.store import SweepResult

    cks = [Checkpoint(f"{long}/checkpoint-{s}", None, f"{long}/checkpoint-{s}", f"id{s}", s, "name")
           for s in (100, 200, 300)]
    results = {}
    for k, ck in enumerate(cks):
        r = synthetic.result(synthetic.block(n_layers=2, n_heads=3), seed=k)
        results[ck.identity] = {"result": {"heads": r.head_rows(), "layers": r.layer_rows(),
                                           "baselines": [{"block": b.block, "metric": b.metric, "mean": b.mean,
                                                          "std": b.std} for b in r.baselines]}}
    return SweepResult(__import__("pathlib").Path(long), {"metrics": "default"}, cks, results)


def test_every_sweep_report_page_keeps_its_text_inside(monkeypatch):
    import qkinspect.report.sweep.pdf as sweep_mod

    real = sweep_mod.__dict__.get("PdfPages")
    from matplotlib.backends import backend_pdf

    bad: list[list[str]] = []

    class Checked(backend_pdf.PdfPages):
        def savefig(self, figure=None, **kw):
            bad.append(texts_outside(figure))
            return super().savefig(figure, **kw)

    assert real is None  # imported inside write_sweep_pdf: patch the backend module
    monkeypatch.setattr(backend_pdf, "PdfPages", Checked)
    n = sweep_mod.write_sweep_pdf(_sweep(LONG_NAMES[0]), io.BytesIO(), title="Pythia 160M: " + LONG_NAMES[1])
    assert len(bad) == n >= 2 and all(b == [] for b in bad), bad
