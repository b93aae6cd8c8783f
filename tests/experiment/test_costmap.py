"""`plot --kind costmap` and the report's estimated experiment section, from the JSON of `experiment --estimate`."""

from __future__ import annotations

import json

import pytest
from pypdf import PdfReader
from typer.testing import CliRunner

from qkinspect.cli.app import app
from qkinspect.experiment.saved import read_experiment
from qkinspect.report.experiment.costmap import costmap_figure, estimate_grid
from tests.experiment import tiny_models as tiny


def cli(*args):
    return CliRunner().invoke(app, list(map(str, args)))


@pytest.fixture(scope="module")
def estimated(tmp_path_factory):
    root = tmp_path_factory.mktemp("costmap")
    model = tiny.llama(root / "llama")
    runs = root / "map.json"
    r = cli("experiment", model, "--edit", "share_qk", "--layers", "1,2", "--tokens", "64", "--window", "32",
            "--estimate", "--probes", "4", "--verify", "3", "-o", runs)
    assert r.exit_code == 0, r.stderr
    return model, runs, json.loads(runs.read_text())


def test_costmap_draws_the_estimate_with_verified_heads_and_rho(estimated, tmp_path):
    _, runs, doc = estimated
    result = read_experiment(runs)
    g = estimate_grid(result, "share_qk")
    assert g.layers == [1, 2] and g.heads == [0, 1, 2, 3]
    for r in doc["runs"]:
        if r["edit"] == "share_qk":
            assert g.values[g.layers.index(r["layer"]), r["head"]] == r["dloss_estimate"]
    fig = costmap_figure(result)
    rho = doc["estimate"]["agreement"][0]["rho"]
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert f"share_qk estimate vs exact: ρ = {rho:.2f} over 3 verified heads: too few to tell" in \
        [" ".join(t.split()) for t in titles]
    circles = [c for ax in fig.axes for c in ax.collections if c.get_label() == "run exactly"]
    assert sum(len(c.get_offsets()) for c in circles) == 3 + 3  # share_qk and ablate, 3 verified each
    out = tmp_path / "map.png"
    r = cli("plot", "--kind", "costmap", "--experiment", runs, "-o", out)
    assert r.exit_code == 0, r.stderr
    assert out.stat().st_size > 10_000


def test_costmap_titles_are_never_cut_at_any_width(estimated):
    """Three edits side by side on the report's page: "estimate vs exact: ρ = … (95 % CI …; 12 verified heads)" was
    cut to "estimate…: ρ undefined"; every title is whole, wrapped (issue 44)."""
    from dataclasses import replace
    from functools import partial

    from qkinspect.experiment.results import Agreement
    from qkinspect.report.experiment.costmap import panel_title
    from qkinspect.report.style import new_figure

    _, runs, _ = estimated
    result = read_experiment(runs)
    long = Agreement("share_qk", 24, -0.4321, 12, 0.1234)
    for agreement, width in (((long,), 7.0), ((long, replace(long, edit="ablate")), 4.0)):
        result = replace(result, estimate=replace(result.estimate, agreement=agreement))
        fig = costmap_figure(result, canvas=partial(new_figure, width=width))
        titles = [" ".join(ax.get_title().split()) for ax in fig.axes if ax.get_title()]
        assert all("…" not in t for t in titles), titles
        assert " ".join(panel_title(result, "share_qk").split()) in titles


def test_verify_2_is_said_on_stderr_in_the_json_and_in_the_figure(estimated, tmp_path):
    """ρ needs three verified heads: `--verify 2` runs, and says so (issue 44)."""
    model, _, _ = estimated
    runs = tmp_path / "two.json"
    r = cli("experiment", model, "--edit", "share_qk", "--layers", "1", "--tokens", "64", "--window", "32",
            "--estimate", "--probes", "4", "--verify", "2", "-o", runs)
    assert r.exit_code == 0, r.stderr
    said = "2 verified heads, and Spearman's ρ between estimate and exact Δloss needs at least 3"
    assert said in r.stderr and "note: share_qk, ablate: " in r.stderr
    assert any(said in n for n in json.loads(runs.read_text())["notes"])
    titles = [" ".join(ax.get_title().split()) for ax in costmap_figure(read_experiment(runs)).axes
              if ax.get_title()]
    assert "share_qk estimate vs exact: 2 verified heads; ρ needs 3" in titles
    r = cli("experiment", model, "--edit", "share_qk", "--layers", "1", "--tokens", "64", "--window", "32",
            "--estimate", "--probes", "4", "--verify", "3", "--format", "json")
    assert "needs at least 3" not in r.stderr and "needs at least 3" not in r.stdout


def test_costmap_refuses_exact_runs_in_one_line(estimated, tmp_path):
    model, _, _ = estimated
    runs = tmp_path / "exact.json"
    assert cli("experiment", model, "--edit", "ablate", "--layers", "0", "--heads", "0", "--tokens", "64",
               "--window", "32", "-o", runs).exit_code == 0
    r = cli("plot", "--kind", "costmap", "--experiment", runs, "-o", tmp_path / "x.png")
    assert r.exit_code == 2 and "no estimates" in r.stderr and r.stderr.count("\n") == 1
    assert not (tmp_path / "x.png").exists()
    r = cli("plot", "--kind", "costmap", "-o", tmp_path / "x.png")
    assert r.exit_code == 2 and "--kind costmap needs --experiment" in r.stderr


def test_report_section_is_built_on_the_costmap(estimated, tmp_path):
    model, runs, doc = estimated
    out = tmp_path / "r.pdf"
    r = cli("report", model, "--experiment", runs, "-o", out)
    assert r.exit_code == 0, r.stderr
    text = " ".join(" ".join(p.extract_text().split()) for p in PdfReader(out).pages)
    assert "Experiment: what editing each head would cost (estimated)" in text
    a = doc["estimate"]["agreement"][0]
    assert f"between estimate and exact Δloss ρ = {a['rho']:.2f} over 3 heads: too few to tell" in text
    assert "share_qk: all 8 heads, by estimate" in text
    assert "Predicted cheapest 2 of 8 reliably estimated heads" in text and "Predicted costliest 2:" in text
    assert "MC error: the Monte-Carlo standard error of the curvature term alone" in text
