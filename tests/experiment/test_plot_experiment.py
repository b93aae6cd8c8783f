"""`qkinspect plot --kind experiment`: the figure drawn from an experiment's JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from qkinspect.cli.app import app
from qkinspect.errors import InputError
from qkinspect.experiment.results import spearman
from qkinspect.experiment.saved import check_experiment, read_experiment
from qkinspect.report.experiment.figure import dloss_grid, experiment_figure
from tests.experiment import tiny_models as tiny


def synthetic(layers=3, heads=4) -> dict:
    rng = np.random.default_rng(0)
    runs = []
    for i in range(layers):
        for h in range(heads):
            p = float(rng.uniform())
            runs.append({"edit": "share_qk", "scope": "head", "layer": i, "head": h, "dloss": p / 10 + 0.001 * h,
                         "predicted": p})
            runs.append({"edit": "ablate", "scope": "head", "layer": i, "head": h, "dloss": 0.05, "predicted": 1.0})
    runs += [{"edit": f"rank:{k}", "scope": "model", "layer": None, "head": None, "dloss": 1 / k, "predicted": None}
             for k in (2, 4, 8)]
    return {"kind": "experiment", "model": {"name": "synthetic"}, "baseline": 2.5,
            "measure": {"name": "next-token cross-entropy"}, "runs": runs}


def test_spearman_against_a_dense_reference():
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(1 - 6 * 2 / (4 * 15))  # 1 - 6Σd²/(n(n²-1))
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1)
    # undefined (fewer than 3 points, a constant side) is None, never NaN: the library's one convention
    assert spearman([1, 2], [2, 1]) is None and spearman([1, 1, 1], [1, 2, 3]) is None


def test_grid_and_figure_from_runs():
    doc = synthetic()
    result = check_experiment(doc, "runs.json")
    g = dloss_grid(result, "share_qk")
    assert g.values.shape == (3, 4) and g.layers == [0, 1, 2]
    assert g.values[1, 2] == next(r["dloss"] for r in doc["runs"]
                                  if (r["edit"], r["layer"], r["head"]) == ("share_qk", 1, 2))
    fig = experiment_figure(result)
    titles = [ax.get_title() for ax in fig.get_axes()]
    assert {"share_qk", "ablate", "truncating the rank", "does the weight metric predict the cost?"} <= set(titles)
    legend = [" ".join(t.get_text().split()) for ax in fig.get_axes() if ax.get_legend()
              for t in ax.get_legend().get_texts()]
    # dloss grows with the prediction here; 12 heads: ρ with its interval (qkinspect.rho)
    assert legend == ["share_qk: Spearman ρ = 1.00 (95 % CI 0.97 to 1.00; 12 heads)"]


def test_not_an_experiment_is_refused(tmp_path):
    f = tmp_path / "x.json"
    f.write_text(json.dumps({"kind": "analyze"}))
    with pytest.raises(InputError, match="not the JSON of `qkinspect experiment`"):
        read_experiment(f)


def test_cli_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = tiny.llama(tmp_path / "llama")
    runs = tmp_path / "runs.json"
    r = CliRunner().invoke(app, ["experiment", str(model), "--edit", "share_qk,rank:4", "--tokens", "64",
                                 "--window", "32", "-o", str(runs)])
    assert r.exit_code == 0, r.stderr
    png = tmp_path / "fig.png"
    r = CliRunner().invoke(app, ["plot", "--kind", "experiment", "--experiment", str(runs), "-o", str(png)])
    assert r.exit_code == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    r = CliRunner().invoke(app, ["plot", "--kind", "experiment", "-o", str(png)])
    assert r.exit_code == 2 and "needs --experiment" in r.stderr
