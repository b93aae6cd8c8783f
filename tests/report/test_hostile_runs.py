"""Issue 25, class 5: a runs.json (`plot --kind experiment --experiment`, `report --experiment`) is checked whole
where it enters: every bad value is one `error:` line naming the file and the key, exit 2, never exit 1."""

from __future__ import annotations

import copy
import json
import time
import tracemalloc
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qkinspect.cli.app import app
from qkinspect.documents import json_safe
from qkinspect.errors import InputError
from qkinspect.experiment.results import experiment_json
from qkinspect.experiment.saved import MAX_CELLS, check_experiment, read_experiment
from qkinspect.report.experiment.figure import experiment_figure
from tests.one_line import one_error_line


def document() -> dict:
    """What `qkinspect experiment -o runs.json` writes for a 2-layer, 2-head model (two edits, head scope)."""
    runs = [{"edit": e, "scope": "head", "layer": i, "head": h, "heads": 1, "loss": 5.0 + d, "dloss": d,
             "dloss_ratio_ablate": 0.5, "predicted": 0.1 * (i + h + 1),
             "predictor": "shared_qk_distance" if e == "share_qk" else None, "offset0_only": False, "seconds": 0.01}
            for e, d in (("share_qk", 0.01), ("ablate", 0.02)) for i in range(2) for h in range(2)]
    runs[0]["dloss"] = 0.03
    runs.append({"edit": "rank:4", "scope": "model", "layer": None, "head": None, "heads": 4, "loss": 5.1,
                 "dloss": 0.1, "dloss_ratio_ablate": None, "predicted": None, "predictor": None,
                 "offset0_only": False, "seconds": 0.1})
    block = {"name": "decoder", "n_layers": 2, "n_heads": 2, "n_kv_heads": 2, "d_model": 8, "d_head": 4}
    return {"schema": "qkinspect/1", "kind": "experiment",
            "model": {"name": "m", "source": "/m", "model_type": "llama", "format": "safetensors",
                      "blocks": [block], "revision": None, "architecture": "LlamaForCausalLM"},
            "measure": {"kind": "causal", "name": "next-token cross-entropy", "text": "t", "tokens": 64,
                        "scored": 62, "windows": 2, "window": 32, "rotary": "gauge"},
            "baseline": 5.0, "predictors": {"share_qk": "shared_qk_distance"}, "runs": runs}


def test_a_good_document_passes_and_draws():
    """Read into the writer's records, it is written again as it was (the runs; the rest as it says)."""
    doc = document()
    result = check_experiment(copy.deepcopy(doc), "runs.json")
    again = json_safe(experiment_json(result))
    assert [{k: r[k] for k in doc["runs"][i]} for i, r in enumerate(again["runs"])] == doc["runs"]
    assert [again[k] for k in ("baseline", "measure", "predictors")] == [doc[k] for k in ("baseline", "measure",
                                                                                         "predictors")]
    assert (result.model.name, result.model.blocks[0].n_heads, result.estimate, result.healing) == ("m", 2, None, None)
    experiment_figure(result)


def mutate(doc: dict, where: str, value) -> dict:
    """Set (or with value DELETE, remove) the key at the dotted path `where` ("runs.3.dloss")."""
    *parents, last = where.split(".")
    node = doc
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if isinstance(node, list):
        last = int(last)
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return doc


DELETE = object()

BAD = {
    "edit rank:abc": ("runs.0.edit", "rank:abc", r"runs\[0\].edit is \"rank:abc\": edit 'rank:abc': rank takes"),
    "edit unknown": ("runs.0.edit", "share", r"runs\[0\].edit is \"share\": unknown edit"),
    "edit number": ("runs.0.edit", 3, r"runs\[0\].edit is 3, not a string"),
    "edit spelt oddly": ("runs.0.edit", "rank:004", r"runs\[0\].edit is \"rank:004\", not written as .* \(rank:4\)"),
    "edit missing": ("runs.0.edit", DELETE, r"runs\[0\].edit is None, not a string"),
    "dloss 1e308": ("runs.1.dloss", 1e308, r"runs\[1\].dloss is 1e\+308, outside -1e\+09 .. 1e\+09"),
    "dloss string": ("runs.1.dloss", "abc", r"runs\[1\].dloss is \"abc\", not a number"),
    "dloss bool": ("runs.1.dloss", True, r"runs\[1\].dloss is True, not a number"),
    "loss list": ("runs.1.loss", [1], r"runs\[1\].loss is an array, not a number"),
    "scope odd": ("runs.2.scope", "block", r"runs\[2\].scope is \"block\", not one of head, layer, model"),
    "layer missing": ("runs.2.layer", DELETE, r"runs\[2\].layer is None, not a whole number"),
    "layer past the model": ("runs.2.layer", 7, r"runs\[2\].layer is 7, outside 0 .. 1 \(the model's layers\)"),
    "head negative": ("runs.2.head", -1, r"runs\[2\].head is -1, outside 0 .. 1"),
    "head float": ("runs.2.head", 1.5, r"runs\[2\].head is 1.5, not a whole number"),
    "run not an object": ("runs.3", [1, 2], r"runs\[3\] is an array, not an object"),
    "baseline missing": ("baseline", DELETE, r"baseline is None, not a number"),
    "baseline inf-like": ("baseline", 1e300, r"baseline is 1e\+300, outside"),
    "model a list": ("model", [], r"model is an array, not an object"),
    "model name number": ("model.name", 5, r"model.name is 5, not a string"),
    "blocks a string": ("model.blocks", "x", r"model.blocks is a string, not a list of blocks"),
    "block counts": ("model.blocks.0.n_heads", "4", r"model.blocks\[0\].n_heads is \"4\", not a whole number"),
    "block zero": ("model.blocks.0.n_layers", 0, r"model.blocks\[0\].n_layers is 0; it must be at least 1"),
    "measure a string": ("measure", "x", r"measure is a string, not an object"),
    "measure name": ("measure.name", None, r"measure.name is None, not a string"),
    "predictors list": ("predictors", [1], r"predictors is an array, not an object"),
    "predictor value": ("predictors.share_qk", 3, r"predictors.share_qk is 3, not a string"),
    "offset0 string": ("runs.0.offset0_only", "no", r"runs\[0\].offset0_only is 'no'|\"no\", not true or false"),
    "seconds negative": ("runs.0.seconds", -1, r"runs\[0\].seconds is -1, outside 0"),
    "kind": ("kind", "analyze", "not the JSON of `qkinspect experiment`"),
    "runs object": ("runs", {}, "not the JSON of `qkinspect experiment`"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_values_name_the_key(case):
    where, value, message = BAD[case]
    with pytest.raises(InputError, match=f"^runs.json: .*{message}" if "JSON of" in message
                       else f"^runs.json: {message}"):
        check_experiment(mutate(document(), where, value), "runs.json")


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    from tests.cli.conftest import save_bert

    return save_bert(tmp_path_factory.mktemp("bert"), seed=0)


@pytest.mark.parametrize("case", ["edit rank:abc", "dloss 1e308", "layer missing", "model a list", "kind"])
def test_plot_and_report_exit_2(tmp_path, tiny_bert, case):
    where, value, _ = BAD[case]
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps(mutate(document(), where, value)))
    for args in (["plot", "--kind", "experiment", "--experiment", runs, "-o", tmp_path / "x.png"],
                 ["report", tiny_bert, "--experiment", runs, "-o", tmp_path / "x.pdf"]):
        line = one_error_line(CliRunner().invoke(app, [str(a) for a in args]))
        assert line.startswith(f"error: {runs}: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.json"]


def test_deep_nesting(tmp_path):
    runs = tmp_path / "runs.json"
    doc = document()
    doc["extra"] = json.loads("[" * 70 + "]" * 70)  # unknown keys are kept, but not nested past the bound
    runs.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="nested more than 64 levels"):
        read_experiment(runs)
    runs.write_text('{"kind": "experiment", "runs": ' + "[" * 200_000 + "]" * 200_000 + "}")
    with pytest.raises(InputError, match="nested more than 64 levels"):
        read_experiment(runs)


def test_a_huge_grid_is_refused_before_it_is_allocated(tmp_path):
    """20,000 distinct (layer, head) pairs with no model shapes to bound them (2.5 MB of JSON): refused."""
    doc = document()
    del doc["model"]["blocks"]
    doc["runs"] = [{"edit": "share_qk", "scope": "head", "layer": i, "head": 20_000 + i, "dloss": 0.1}
                   for i in range(20_000)]
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps(doc))
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(InputError, match=f"span 20000 layers × 20000 heads for share_qk, more than the "
                                             f"{MAX_CELLS} cells"):
            read_experiment(runs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - t0 < 10 and peak < 200 << 20
    # with the model's declared shape, a layer past it is refused by name
    doc = document()
    doc["runs"][0]["layer"] = 19_999
    with pytest.raises(InputError, match=r"runs\[0\].layer is 19999, outside 0 .. 1 \(the model's layers\)"):
        check_experiment(doc, "runs.json")


def test_the_real_experiment_output_passes(tmp_path, monkeypatch):
    from tests.experiment import tiny_models as tiny

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = tiny.llama(tmp_path / "llama")
    runs = tmp_path / "runs.json"
    r = CliRunner().invoke(app, ["experiment", str(model), "--edit", "share_qk,rank:4", "--tokens", "64",
                                 "--window", "32", "--layers", "0", "-o", str(runs)])
    assert r.exit_code == 0, r.stderr
    assert read_experiment(runs).runs
    assert Path(runs).stat().st_size > 0


@pytest.mark.parametrize("option", ["--experiment", "--composition"])
def test_a_section_document_is_refused_with_html(tmp_path, option):
    """--experiment and --composition add sections to the model's PDF report only: with --html, one line naming the
    option and its file, exit 2, nothing written."""
    doc = tmp_path / "doc.json"
    doc.write_text("{}")
    r = CliRunner().invoke(app, ["report", option, str(doc), "--html", "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 2
    assert one_error_line(r) == (f"error: {option} {doc}: the {option[2:]} section is in a model's PDF report only; "
                                 "leave out --html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc.json"]
