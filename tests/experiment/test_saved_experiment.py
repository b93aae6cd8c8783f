"""The experiment's document read back into the records it was written from (qkinspect.experiment.saved): every
record family round-trips through `save_experiment` and `read_experiment`; documents as older qkinspects wrote them
(no standard errors, no estimate, healing without curves) are still read; the sections read since the records are
typed (estimate, healing, the runs' estimates) are checked where they enter; and what the runs cost per K
(qkinspect.experiment.costs.rank_points) on known numbers. No model is run."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from qkinspect.cli.app import app
from qkinspect.errors import InputError
from qkinspect.experiment.costs import rank_points
from qkinspect.experiment.results import (
    Agreement,
    Estimate,
    ExperimentResult,
    HealChange,
    HealedRun,
    Healing,
    HealPoint,
    Precision,
    Run,
    save_experiment,
)
from qkinspect.experiment.saved import check_experiment, read_experiment
from qkinspect.layer import BlockSpec, ModelInfo
from tests.one_line import one_error_line


def run(edit="share_qk", scope="head", layer=0, head=0, dloss=0.1, **kw) -> Run:
    fields = dict(edit=edit, scope=scope, layer=layer, head=head, heads=1, loss=None if dloss is None else 3 + dloss,
                  dloss=dloss, ratio=None, predicted=None, offset0=False, seconds=0.2, forward_seconds=None)
    return Run(**{**fields, **kw})


def curve(*diffs: float) -> tuple[HealPoint, ...]:
    return tuple(HealPoint(step=2 * i, loss=3 + d, diff=d, se=None if i == 0 else 0.01) for i, d in enumerate(diffs))


def full_result(**healing_changes) -> ExperimentResult:
    """Every record the writer writes, each field set (forward_seconds, which the document does not carry, None)."""
    model = ModelInfo(name="tiny", source="/models/tiny", model_type="llama", format="safetensors",
                      blocks=(BlockSpec("decoder", 2, 4, 2, 16, 4, positional="rope", rotary_dims=4),),
                      dtype="float32", attention_bytes=4096, architecture="LlamaForCausalLM")
    runs = (run(ratio=0.5, predicted=0.3, offset0=True, dloss_se=0.01, dloss_estimate=0.09, dloss_estimate_se=0.002,
                moved=1.5, unreliable=False),
            run(layer=1, head=3, dloss=None, dloss_estimate=-0.02, dloss_estimate_se=0.001, moved=7.0, unreliable=True),
            run("ablate", "layer", 1, None, 0.4, heads=4, dloss_se=0.03),
            run("rank:2", "model", None, None, 0.2, heads=8, predicted=0.7, dloss_se=0.02))
    healed = HealedRun(edit="share_qk", scope="layer", layer=1, head=None, heads=4, loss=3.05, control_loss=3.0,
                       diff=0.05, se=0.01, unhealed=0.1, recovered=0.5, violation=0.0, train_loss=(3.3, 3.2),
                       seconds=0.5, curve=curve(0.1, 0.05), late=HealChange(1, 2, -0.02, 0.004))
    healing = Healing(steps=2, train="attention", trained="the attention weights", trained_parameters=100,
                      parameters=1000, lr=1e-3, text="heal.txt", train_tokens=64, batch_windows=2, epochs=1.0,
                      control_loss=3.0, control_gain=-0.01, control_train_loss=(3.2, 3.1), runs=(healed,),
                      seconds=1.0, tracks={"share_qk L1": "/tmp/track"}, notes=("a note",), eval_every=2,
                      control_curve=curve(0.0, -0.01), precision=Precision("float32", "asked", None, None, 0.01),
                      device="cpu", step_seconds=0.1, control_late=HealChange(1, 2, 0.001, None))
    return ExperimentResult(model=model, measure="causal", text="pydoc_data.topics", tokens=64, scored=62, windows=2,
                            window=32, baseline=3.0, runs=runs, rotary="gauge", baseline_seconds=0.1, seconds=0.5,
                            predictors={"share_qk": "shared_qk_distance", "rank:2": "rank_tail"},
                            healing=replace(healing, **healing_changes),
                            estimate=Estimate(probes=4, seconds=1.0, verify_seconds=2.0,
                                              agreement=(Agreement("share_qk", 1, None, 0, None),)))


def test_every_record_reads_back_as_written(tmp_path):
    result = full_result()
    save_experiment(result, tmp_path / "runs.json")
    back = read_experiment(tmp_path / "runs.json")
    assert back == result
    assert back.measure_name == "next-token cross-entropy"


def test_the_records_name_every_measure_the_runtime_makes():
    """MEASURES sits beside the records (torch-free); the runtime's kinds are its keys, none left unnamed."""
    from qkinspect.experiment.model.runtime import CAUSAL, DRIFT, MASKED
    from qkinspect.experiment.results import MEASURES

    assert set(MEASURES) == {CAUSAL, MASKED, DRIFT}


def test_a_diverged_healing_reads_back_as_nan(tmp_path):
    """The writer writes NaN as null (json_safe): read back, a training loss or a healed loss is NaN again."""
    r = full_result()
    nan = replace(r.healing.runs[0], loss=math.nan, diff=math.nan, recovered=None, train_loss=(3.3, math.nan))
    save_experiment(full_result(runs=(nan,)), tmp_path / "runs.json")
    assert json.loads((tmp_path / "runs.json").read_text())["healing"]["runs"][0]["train_loss"] == [3.3, None]
    back = read_experiment(tmp_path / "runs.json").healing.runs[0]
    assert math.isnan(back.loss) and math.isnan(back.diff) and math.isnan(back.train_loss[1])
    assert back.train_loss[0] == 3.3 and back.control_loss == 3.0


def first_document() -> dict:
    """What the first `qkinspect experiment -o` wrote (before standard errors, estimates and healing)."""
    block = {"name": "decoder", "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_model": 16, "d_head": 4,
             "positional": "rope", "rotary_dims": 4, "flags": ["gqa"]}
    return {"schema": "qkinspect/1", "kind": "experiment", "tool": {"name": "qkinspect", "version": "0.1.0"},
            "model": {"name": "tiny", "source": "/m", "model_type": "llama", "format": "safetensors",
                      "blocks": [block], "revision": None, "dtype": "float32", "architecture": "LlamaForCausalLM"},
            "measure": {"kind": "causal", "name": "next-token cross-entropy", "text": "t", "tokens": 64,
                        "scored": 62, "windows": 2, "window": 32, "rotary": "gauge"},
            "baseline": 3.0, "predictors": {"share_qk": "shared_qk_distance"},
            "timing": {"baseline_seconds": 0.1, "runs_seconds": 0.2},
            "runs": [{"edit": "share_qk", "scope": "head", "layer": 0, "head": h, "heads": 1, "loss": 3.1,
                      "dloss": 0.1, "dloss_ratio_ablate": None, "predicted": 0.2, "predictor": "shared_qk_distance",
                      "offset0_only": False, "seconds": 0.1} for h in range(4)]}


def first_healing() -> dict:
    """The healing section as the first qkinspect that healed wrote it (no curves, precision, device)."""
    return {"steps": 2, "train": "attention", "trained": "the attention weights", "trained_parameters": 100,
            "parameters": 1000, "lr": 0.001, "text": "t", "train_tokens": 64, "batch_windows": 2, "epochs": 1.0,
            "control_loss": 3.0, "control_gain": -0.01, "control_train_loss": [3.2, 3.1], "seconds": 1.0,
            "tracks": {}, "notes": [],
            "runs": [{"edit": "share_qk", "scope": "layer", "layer": 0, "head": None, "heads": 4, "loss": 3.05,
                      "control_loss": 3.0, "diff": 0.05, "se": 0.01, "unhealed": 0.1, "recovered": 0.5,
                      "violation": 0.0, "train_loss": [3.3, 3.2], "seconds": 0.5}]}


def test_documents_older_qkinspects_wrote_are_read():
    old = check_experiment(first_document(), "runs.json")
    assert [r.dloss_se for r in old.runs] == [None] * 4 and old.estimate is None and old.healing is None
    assert old.model.blocks[0].positional == "rope" and old.seconds == 0.2
    healed = check_experiment({**first_document(), "healing": first_healing()}, "runs.json").healing
    assert healed.runs[0].curve == () and healed.control_curve == () and healed.precision is None
    assert (healed.device, healed.eval_every, healed.step_seconds) == ("cpu", None, None)


def test_the_healing_figure_of_a_healing_without_curves_is_refused_in_one_line(tmp_path):
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps({**first_document(), "healing": first_healing()}))
    out = tmp_path / "h.png"
    line = one_error_line(CliRunner().invoke(app, ["plot", "--kind", "healing", "--experiment", str(runs), "-o",
                                                   str(out)]))
    assert "needs healing scored along the way" in line and not out.exists()


def with_estimate(**agreement) -> dict:
    doc = first_document()
    doc["estimate"] = {"probes": 4, "seconds": 1.0, "verify_seconds": 1.0,
                       "agreement": [{"edit": "share_qk", "verified": 4, "rho": 0.5, "sampled": 2,
                                      "rho_sampled": None, **agreement}]}
    return doc


def with_healing(where: str, value) -> dict:
    doc = {**first_document(), "healing": first_healing()}
    node = doc["healing"]
    *parents, last = where.split(".")
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if value is DELETE:
        del node[last]
    else:
        node[int(last) if isinstance(node, list) else last] = value
    return doc


DELETE = object()

BAD = {
    "rho past 1": (lambda: with_estimate(rho=1.5), r"estimate.agreement\[0\].rho is 1.5, outside -1 .. 1"),
    "verified text": (lambda: with_estimate(verified="4"), r"estimate.agreement\[0\].verified is \"4\", not a whole"),
    "agreement a list": (lambda: {**first_document(), "estimate": {"agreement": {}}},
                         r"estimate.agreement is an object, not a list"),
    "estimate a number": (lambda: {**first_document(), "estimate": 3}, r"estimate is a number, not an object"),
    "unreliable text": (lambda: {**first_document(), "runs": [{**first_document()["runs"][0], "unreliable": "yes"}]},
                        r"runs\[0\].unreliable is \"yes\", not true or false"),
    "se negative": (lambda: {**first_document(), "runs": [{**first_document()["runs"][0], "dloss_se": -1}]},
                    r"runs\[0\].dloss_se is -1, outside 0"),
    "estimate inf-like": (lambda: {**first_document(), "runs": [{**first_document()["runs"][0],
                                                                 "dloss_estimate": 1e300}]},
                          r"runs\[0\].dloss_estimate is 1e\+300, outside"),
    "timing text": (lambda: {**first_document(), "timing": {"runs_seconds": "x"}},
                    r"timing.runs_seconds is \"x\", not a number"),
    "healing steps missing": (lambda: with_healing("steps", DELETE), r"healing.steps is None, not a whole number"),
    "healing loss missing": (lambda: with_healing("runs.0.loss", DELETE), r"healing.runs\[0\].loss is missing"),
    "healing edit": (lambda: with_healing("runs.0.edit", "rank:x"), r"healing.runs\[0\].edit is \"rank:x\""),
    "healing layer": (lambda: with_healing("runs.0.layer", 5), r"healing.runs\[0\].layer is 5, outside 0 .. 1"),
    "healing curve": (lambda: with_healing("runs.0.curve", [{"step": 0, "loss": 3, "diff": "x"}]),
                      r"healing.runs\[0\].curve\[0\].diff is \"x\", not a number"),
    "healing train loss": (lambda: with_healing("control_train_loss", [3.0, [1]]),
                           r"healing.control_train_loss\[1\] is an array, not a number"),
    "healing precision": (lambda: with_healing("precision", {"dtype": 16}),
                          r"healing.precision.dtype is 16, not a string"),
    "healing runs": (lambda: with_healing("runs", "all"), r"healing.runs is a string, not a list"),
    "late past the end": (lambda: with_healing("runs.0.late", {"start": 1, "end": 3, "change": 0, "se": None}),
                          r"healing.runs\[0\].late.end is 3, outside 0 .. 2"),
    "late backwards": (lambda: with_healing("control_late", {"start": 2, "end": 2, "change": 0, "se": None}),
                       r"healing.control_late.start is 2, outside 0 .. 1"),
    "late from 0": (lambda: with_healing("control_late", {"start": 0, "end": 2, "change": 0, "se": None}),
                    r"healing.control_late.start must be at least 1"),
    "late change text": (lambda: with_healing("runs.0.late", {"start": 1, "end": 2, "change": "x", "se": None}),
                         r"healing.runs\[0\].late.change is \"x\", not a number"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_the_typed_sections_are_checked_where_they_enter(case):
    make, message = BAD[case]
    with pytest.raises(InputError, match=f"^runs.json: {message}"):
        check_experiment(make(), "runs.json")


def test_the_report_refuses_a_bad_healing_section_in_one_line(tmp_path):
    from tests.cli.conftest import save_bert

    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps(with_healing("lr", "fast")))
    out = tmp_path / "r.pdf"
    line = one_error_line(CliRunner().invoke(app, ["report", str(save_bert(tmp_path / "bert", seed=0)),
                                                   "--experiment", str(runs), "-o", str(out)]))
    assert line == f"error: {runs}: healing.lr is \"fast\", not a number" and not out.exists()


def test_rank_points_average_at_the_widest_scope_with_two_k():
    def result(*runs: Run) -> ExperimentResult:
        return ExperimentResult(model=full_result().model, measure=None, text=None, tokens=None, scored=None,
                                windows=None, window=None, baseline=3.0, runs=runs, rotary=None,
                                baseline_seconds=None, seconds=None)

    layers = [run(f"rank:{k}", "layer", i, None, d) for k, ds in ((2, (0.3, 0.5)), (8, (0.1, 0.2)))
              for i, d in enumerate(ds)]
    assert rank_points(result(*layers)) == [(2, pytest.approx(0.4)), (8, pytest.approx(0.15))]
    # one K at model scope is not a curve: the layers' two K are; a model's Δloss is never averaged with a layer's
    assert rank_points(result(run("rank:4", "model", None, None, 9.0), *layers)) == rank_points(result(*layers))
    models = [run(f"rank:{k}", "model", None, None, 1 / k) for k in (4, 2)]
    assert rank_points(result(*models, *layers)) == [(2, 0.5), (4, 0.25)]
    # runs without a loss (estimated only) and other edits are not points
    assert rank_points(result(run("rank:2", dloss=None), run("rank:4"), run("share_qk"))) == []
