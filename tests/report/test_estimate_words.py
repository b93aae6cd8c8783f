"""The estimated map's figures and pages say what they show: short, disjoint lists of predicted cheapest and
costliest heads; every Spearman ρ with its number of heads and interval (or "too few to tell"); the estimate's ±
named as the Monte-Carlo error of its curvature term; `plot --kind experiment` of a map keeps its head axis whole.
Documents are built in code and read as `plot` and `report` read them (no model is run)."""

from __future__ import annotations

import io

import numpy as np
import pytest

from qkinspect.experiment.results import ExperimentResult
from qkinspect.experiment.saved import check_experiment
from qkinspect.report.experiment import costmap
from qkinspect.report.experiment.figure import dloss_grid, experiment_figure
from qkinspect.report.pages import TextPages


def estimated_doc(layers: int = 3, heads: int = 3, verified=((0, 0), (0, 2), (1, 1), (2, 0), (2, 2), (1, 2)),
                  rho: float | None = -1.0) -> ExperimentResult:
    """An `experiment --estimate` document, read back: every head estimated, the `verified` ones run exactly."""
    rng = np.random.default_rng(1)
    runs = []
    for i in range(layers):
        for h in range(heads):
            exact = (i, h) in verified
            runs.append({"edit": "share_qk", "scope": "head", "layer": i, "head": h, "heads": 1,
                         "dloss_estimate": float(rng.normal(0.01, 0.01)), "dloss_estimate_se": 0.001,
                         "unreliable": False, "moved": 1.0, "predicted": float(rng.uniform()),
                         "dloss": float(rng.normal(0.01, 0.01)) if exact else None,
                         "dloss_se": 0.002 if exact else None, "loss": 3.0 if exact else None})
    n = len(verified)
    return check_experiment({"kind": "experiment", "model": {"name": "tiny"}, "baseline": 3.0,
                             "measure": {"name": "next-token cross-entropy", "scored": 64, "text": "a text"},
                             "estimate": {"probes": 4, "agreement": [{"edit": "share_qk", "verified": n, "rho": rho,
                                                                        "sampled": 2, "rho_sampled": 1.0}]},
                             "runs": runs}, "map.json")


@pytest.mark.parametrize("n", [1, 2, 3, 4, 9, 16, 40, 144])
def test_the_predicted_cheapest_and_costliest_are_short_and_disjoint(n):
    """9 heads listed 8 as cheapest and 8 as costliest."""
    runs = sorted(estimated_doc(layers=n, heads=1, verified=()).runs, key=lambda r: r.dloss_estimate)
    words = costmap.extremes_words(runs)
    if n == 1:
        assert words.startswith("One head estimated reliably: L0.H0")
        return
    cheap, dear = words.split(". Predicted costliest")
    cheap_heads = {w.split(" ")[0] for w in cheap.split(": ", 1)[1].split(", ")}
    dear_heads = {w.split(" ")[0] for w in dear.split(": ", 1)[1].rstrip(".").split(". ")[0].split(", ")}
    k = costmap.named_each(n)
    assert len(cheap_heads) == len(dear_heads) == k >= 1 and not cheap_heads & dear_heads
    assert k <= costmap.NAMED and 2 * k <= n and (k <= n // 4 or n < 4)
    assert cheap_heads == {f"L{r.layer}.H{r.head}" for r in runs[:k]}


def _section_text(doc) -> str:
    seen: list[str] = []
    pages = TextPages(lambda fig: seen.extend(t.get_text() for t in fig.texts))
    costmap.estimate_section(pages, doc, __import__("pathlib").Path("map.json"))
    pages.close()
    return " ".join(" ".join(seen).split())


def test_every_rho_shows_its_heads_and_interval_or_too_few():
    few = estimated_doc()  # 6 verified heads, ρ = -1
    assert costmap.panel_title(few, "share_qk") == \
        "share_qk\nestimate vs exact: ρ = −1.00 over 6 verified heads: too few to tell"
    text = _section_text(few)
    assert "exact Δloss ρ = −1.00 over 6 heads: too few to tell" in text
    assert "over the 2 drawn at random alone, ρ = 1.00 over 2 heads: too few to tell" in text
    many = estimated_doc(layers=4, heads=4, verified=tuple((i, h) for i in range(4) for h in range(3)), rho=0.6)
    # by hand: z = atanh(0.6) = 0.693, se = √((1 + 0.18) / 9) = 0.362, tanh(0.693 ∓ 1.96 · 0.362) = −0.017, 0.886
    assert costmap.panel_title(many, "share_qk") == \
        "share_qk\nestimate vs exact: ρ = 0.60 (95 % CI −0.02 to 0.89; 12 verified heads)"
    fig = costmap.costmap_figure(many)
    assert any("95 % CI" in ax.get_title().replace("\n", " ") for ax in fig.axes)


def test_the_experiment_figure_of_an_estimated_map_keeps_its_head_axis_whole():
    """Only the verified heads were drawn, on an axis with the other heads left out (0, 2, 3 of 4)."""
    doc = estimated_doc(layers=3, heads=4, verified=((0, 0), (0, 2), (1, 3), (2, 0), (2, 3), (1, 2)))
    g = dloss_grid(doc, "share_qk")
    assert g.layers == [0, 1, 2] and g.heads == [0, 1, 2, 3]
    assert int(np.isfinite(g.values).sum()) == 6  # the others grey: not run exactly
    fig = experiment_figure(doc)
    labels = [" ".join(t.get_text().split()) for ax in fig.axes if ax.get_legend()
              for t in ax.get_legend().get_texts()]
    assert labels == ["share_qk: Spearman ρ = " + labels[0].split("ρ = ")[1]]
    assert labels[0].endswith("over 6 heads: too few to tell")
    titles = " ".join(" ".join(sub.get_suptitle().split()) for sub in fig.subfigs)
    assert "grey: estimated only" in titles and "--kind costmap" in titles


def test_the_estimate_table_names_its_error_and_says_what_na_means():
    from pypdf import PdfReader

    t = costmap.estimate_table(estimated_doc(), "share_qk")
    assert t.header[2] == "MC error (curvature term)" and "± MC" not in t.header
    assert "Monte-Carlo standard error of the curvature term alone" in costmap.TABLE_LEGEND
    assert "n/a: the head was not run exactly" in costmap.TABLE_LEGEND
    buf = io.BytesIO()
    from matplotlib.backends.backend_pdf import PdfPages

    with PdfPages(buf) as pdf:
        pages = TextPages(pdf.savefig)
        pages.table(t)
        pages.close()
    text = " ".join(PdfReader(buf).pages[0].extract_text().split())
    assert "MC error" in text and "(curvature term)" in text and "± MC" not in text  # a header of two lines


def test_the_cli_table_names_the_monte_carlo_error_and_the_dash(tmp_path):
    """`experiment --estimate`'s table: the estimate's ± is the Monte-Carlo error of its curvature term (it was
    "±est", beside the exact run's "±"), `-` is said in the legend, ρ comes with its heads and "too few to tell"."""
    from typer.testing import CliRunner

    from qkinspect.cli.app import app
    from tests.experiment import tiny_models as tiny

    model = tiny.llama(tmp_path / "llama")
    r = CliRunner().invoke(app, ["experiment", str(model), "--edit", "share_qk", "--layers", "1", "--tokens", "64",
                                 "--window", "32", "--estimate", "--probes", "4", "--verify", "3", "--format",
                                 "table"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "±MC" in r.stdout and "±est" not in r.stdout
    assert "±MC=Monte-Carlo standard error of the estimate's curvature term alone" in out
    assert "-=none: Δloss and ± of a head not run exactly" in out
    assert "agreement share_qk: Spearman's rank correlation of estimate and exact Δloss ρ = " in out
    assert "over 3 verified heads: too few to tell" in out
    lines = r.stdout.split("columns:")[0].splitlines()
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("edit")):]  # below the wrapped title
    assert all(len(line) <= 80 for line in r.stdout.splitlines())  # the title and the legend wrap too
    assert table[0].startswith("edit") and "±MC" in table[0] and max(len(line) for line in table) <= 80
