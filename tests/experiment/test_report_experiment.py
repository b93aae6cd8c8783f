"""`qkinspect report MODEL --experiment runs.json`: the experiment section's words and numbers, read back from the
PDF with pypdf and checked against the runs.json of a real (tiny) experiment; and the refusals."""

from __future__ import annotations

import json
import re

import pytest
from pypdf import PdfReader
from scipy.stats import spearmanr
from typer.testing import CliRunner

from qkinspect.cli.app import app
from qkinspect.experiment import costs
from qkinspect.experiment.saved import check_experiment
from qkinspect.report.experiment.pages import dfmt, meaning
from qkinspect.report.style import fmt
from qkinspect.rho import rho_text
from tests.experiment import tiny_models as tiny

SMALL = ("--tokens", "64", "--window", "32")


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny Llama, the runs.json of share_qk and rank:4 on every head (ablate as reference), and its report."""
    root = tmp_path_factory.mktemp("report_experiment")
    model = tiny.llama(root / "llama")
    runs = root / "runs.json"
    r = cli("experiment", model, "--edit", "share_qk,rank:4", *SMALL, "--format", "json", "-o", runs)
    assert r.exit_code == 0, r.stderr
    out = root / "report.pdf"
    r = cli("report", model, "--experiment", runs, "-o", out)
    assert r.exit_code == 0, r.stderr
    n = int(re.search(r"wrote an? (\d+)-page report", r.stderr).group(1))
    pages = [p.extract_text() for p in PdfReader(out).pages]
    assert len(pages) == n
    return root, model, runs, json.loads(runs.read_text()), pages


def words(s: str) -> str:
    return " ".join(s.split())


def test_section_holds_the_numbers_of_runs_json(setup):
    _, _, _, doc, pages = setup
    section = next(i for i, p in enumerate(pages) if "Experiment: what editing the heads costs" in p)
    assert section == 2  # right after the cover and the summary
    text = words(pages[section])
    assert f"Baseline (unedited) loss: {fmt(doc['baseline'])}." in text
    head = {e: [r for r in doc["runs"] if r["edit"] == e] for e in ("share_qk", "rank:4", "ablate")}
    assert all(len(v) == 12 for v in head.values())  # 3 layers × 4 heads, each edit
    ablate = sum(r["dloss"] for r in head["ablate"])
    ablate_se = sum(r["dloss_se"] for r in head["ablate"])
    for e in ("share_qk", "rank:4"):
        total = sum(r["dloss"] for r in head[e])
        assert f"{e}: Δloss {dfmt(total)}, summed over 12 runs, one head edited at a time" in text, e
        if ablate > 2 * ablate_se:  # a ratio only to an ablation cost beyond its error (Σ se bounds it)
            assert f"{fmt(total / ablate)} times what removing the same heads costs" in text, e
        else:
            assert "times what removing the same heads costs" not in text
        x = [r["predicted"] for r in head[e]]
        y = [r["dloss"] for r in head[e]]
        rho, p = spearmanr(x, y)
        assert f"{e}: Spearman's rank correlation between {doc['predictors'][e]} and Δloss " \
               f"{rho_text(rho, 12)}, p = {p:.2g}" in text, e
        assert "(95 % CI" in rho_text(rho, 12)  # 12 heads: an interval, not "too few to tell"
    share = sorted(head["share_qk"], key=lambda r: (r["dloss"], r["layer"], r["head"]))
    abl = {(r["layer"], r["head"]): r for r in head["ablate"]}
    free = [r for r in share if r["dloss_ratio_ablate"] is not None
            and r["dloss"] + 2 * r["dloss_se"] <= 0.1 * abl[(r["layer"], r["head"])]["dloss"]]
    assert f"{len(free)} of 12 heads: share_qk costs them at most 0.1 of what removing the head costs, beyond " \
           "the error of both" in text
    cheapest = share[0]
    assert (f"Smallest share_qk Δloss: L{cheapest['layer']}.H{cheapest['head']} ({dfmt(cheapest['dloss'])} ± "
            f"{dfmt(cheapest['dloss_se'])})") in text
    costly = sorted((r for r in share if r["dloss"] > 2 * r["dloss_se"]), key=lambda r: -r["dloss"])
    if costly:
        c = costly[0]
        assert f"Largest beyond its error: L{c['layer']}.H{c['head']} ({dfmt(c['dloss'])} ±" in text
    else:
        assert "No head's share_qk Δloss exceeds 2 standard errors." in text


def test_figure_and_head_table(setup):
    _, _, _, doc, pages = setup
    text = "\n".join(pages)
    assert "does the weight metric predict the cost?" in text
    assert (f"llama: what editing the attention heads costs (Δ next-token cross-entropy; unedited "
            f"{doc['baseline']:.3f})") in words(text)  # the title, wrapped to the page
    assert "share_qk: all 12 heads, cheapest first" in text
    table = words(text[text.index("share_qk: all 12 heads"):])
    for r in doc["runs"]:
        if r["edit"] == "share_qk":
            row = (f"L{r['layer']}.H{r['head']} {dfmt(r['dloss'])} {dfmt(r['dloss_se'])} "
                   f"{fmt(r['dloss_ratio_ablate'])} {fmt(r['predicted'])}")
            assert row in table, row


def test_model_scope_cost_and_its_ratio(tmp_path):
    model = tiny.gpt2(tmp_path / "gpt2")
    runs = tmp_path / "runs.json"
    r = cli("experiment", model, "--edit", "share_qk", "--scope", "model", *SMALL, "-o", runs)
    assert r.exit_code == 0, r.stderr
    doc = json.loads(runs.read_text())
    share = next(x for x in doc["runs"] if x["edit"] == "share_qk")
    out = tmp_path / "r.pdf"
    r = cli("report", model, "--experiment", runs, "-o", out)
    assert r.exit_code == 0, r.stderr
    text = words("\n".join(p.extract_text() for p in PdfReader(out).pages))
    if share["dloss_ratio_ablate"] is not None:
        assert (f"share_qk: Δloss {dfmt(share['dloss'])}, edited in all the chosen heads at once; "
                f"{fmt(share['dloss_ratio_ablate'])} times what removing the same heads costs") in text
    else:  # ablating lowers this random model's loss, or not beyond its error: no ratio is printed
        assert f"share_qk: Δloss {dfmt(share['dloss'])}, edited in all the chosen heads at once." in text
    assert "Does the weight metric predict the cost?" not in text  # one run: no ρ to give


def test_without_reference_runs(setup, tmp_path):
    _, model, _, _, _ = setup
    runs = tmp_path / "runs.json"
    r = cli("experiment", model, "--edit", "share_qk", "--layers", "2", "--no-reference", *SMALL, "-o", runs)
    assert r.exit_code == 0, r.stderr
    doc = json.loads(runs.read_text())
    out = tmp_path / "r.pdf"
    r = cli("report", model, "--experiment", runs, "-o", out)
    assert r.exit_code == 0, r.stderr
    text = words("\n".join(p.extract_text() for p in PdfReader(out).pages))
    total = sum(x["dloss"] for x in doc["runs"])
    assert f"share_qk: Δloss {dfmt(total)}, summed over 4 runs, one head edited at a time" in text
    assert "times what removing" not in text and "heads: share_qk costs them at most" not in text
    assert ("No ablation of the same heads costs loss beyond its error (or the runs were made with "
            "--no-reference)") in text


@pytest.mark.parametrize("case", ["other model", "html", "not an experiment", "missing"])
def test_refusals(setup, tmp_path, case):
    root, model, runs, _, _ = setup
    out = tmp_path / ("r.html" if case == "html" else "r.pdf")
    if case == "other model":
        model = tiny.llama(tmp_path / "llama_b", seed=1)  # same shapes, another folder
    elif case == "not an experiment":
        runs = tmp_path / "x.json"
        runs.write_text(json.dumps({"kind": "analyze"}))
    elif case == "missing":
        runs = tmp_path / "nope.json"
    r = cli("report", model, "--experiment", runs, *(["--html"] if case == "html" else []), "-o", out)
    assert r.exit_code == 2, r.output
    message = {"other model": "the experiment was run on 'llama'", "html": "leave out --html",
               "not an experiment": "not the JSON of `qkinspect experiment`",
               "missing": "cannot read an experiment document"}[case]
    assert r.stderr.startswith("error: ") and message in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert str(runs) in r.stderr and not out.exists()


def _doc(runs: list[dict]):
    """The records of a document that records only its runs, its baseline and its predictors."""
    return check_experiment({"kind": "experiment", "baseline": 2.0, "predictors": {"share_qk": "shared_qk_distance"},
                             "runs": runs}, "runs.json")


def _run(edit, scope, layer, head, dloss, predicted=None, ratio=None, se=0.001):
    return {"edit": edit, "scope": scope, "layer": layer, "head": head, "dloss": dloss, "predicted": predicted,
            "dloss_ratio_ablate": ratio, "dloss_se": se}


def test_summary_logic_on_known_numbers():
    runs = [_run("share_qk", "head", 0, h, d, p, d / 0.1) for h, (d, p) in enumerate(
        [(0.001, 0.1), (0.005, 0.2), (0.02, 0.3), (0.05, 0.4)])]
    runs += [_run("ablate", "head", 0, h, 0.1) for h in range(4)]
    runs += [_run("share_qk", "layer", 0, None, 0.3), _run("ablate", "layer", 0, None, 0.6)]
    doc = _doc(runs)
    assert costs.edits(doc) == ["share_qk", "ablate"]
    c = costs.edit_cost(doc, "share_qk")
    assert (c.scope, c.units, c.dloss, c.ratio) == ("layer", 1, 0.3, 0.5)  # the widest scope run
    # free: Δloss + 2 se within 0.1 of ablating (0.1): 0.001 + 0.002 and 0.005 + 0.002 are, 0.02 is not
    assert [(h.head, h.dloss) for h in costs.free_heads(costs.head_costs(doc, "share_qk"))] == [(0, 0.001), (1, 0.005)]
    assert [h.head for h in costs.costly_heads(costs.head_costs(doc, "share_qk"))] == [3, 2, 1]
    noisy = _doc([_run("share_qk", "head", 0, 0, 0.005, ratio=0.05, se=0.004), _run("ablate", "head", 0, 0, 0.1)])
    assert costs.free_heads(costs.head_costs(noisy, "share_qk")) == []  # 0.005 + 2 × 0.004 > 0.01: noise could hide it
    assert costs.costly_heads(costs.head_costs(noisy, "share_qk")) == []
    p = costs.prediction(doc, "share_qk")
    # 4 heads in perfect order: scipy's p is ~0, but 1 of the 24 orders of 4 heads is perfect by chance
    assert (p.n, p.rho) == (4, pytest.approx(1.0)) and "4 heads are too few to tell" in meaning(p)
    many = _doc([_run("share_qk", "head", i, h, 0.001 * (4 * i + h + 1), 0.1 * (4 * i + h)) for i in range(3)
                 for h in range(4)])
    assert "closely predicts the cost" in meaning(costs.prediction(many, "share_qk"))
    doc = _doc([r for r in runs if r["scope"] == "head"])
    c = costs.edit_cost(doc, "share_qk")
    assert (c.scope, c.units) == ("head", 4) and c.dloss == pytest.approx(0.076)
    assert c.ratio == pytest.approx(0.076 / 0.4)
    assert costs.edit_cost(_doc([_run("share_qk", "head", 0, 0, 0.1)]), "share_qk").ratio is None  # no ablate runs
    assert costs.prediction(_doc([_run("share_qk", "head", 0, h, 0.1, h) for h in range(4)]), "share_qk") is None
