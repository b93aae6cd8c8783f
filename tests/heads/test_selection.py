"""`qkinspect heads --layers/--heads` (library `layers=`, `heads=`): only the selected heads are scored, each score
and weight metric equal to the unselected run's on the same head; the forward pass stops after the last selected
layer; the relations are over the selection; a selection the model lacks is refused in analyze's words."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import qkinspect
from qkinspect.cli.app import app
from qkinspect.errors import InputError
from tests.experiment import tiny_models
from tests.one_line import one_error_line

SMALL = dict(sequences=6, length=12, windows=3, window=24, batch=4, resamples=100, permutations=100)
CLI_SMALL = ["--sequences", "6", "--length", "12", "--windows", "3", "--window", "24", "--resamples", "100",
             "--permutations", "100"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """3 layers, 4 query heads reading 2 key/value heads."""
    return tiny_models.llama(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def every_head(llama):
    return qkinspect.heads(str(llama), **SMALL)


@pytest.mark.parametrize("layers, heads, want_layers, want_heads", [
    ("1", [0, 3], [1], [0, 3]), ("0,2", None, [0, 2], None), (None, "1-2", None, [1, 2]), ([2], 3, [2], [3])])
def test_the_selected_heads_score_as_in_the_whole_run(llama, every_head, layers, heads, want_layers, want_heads):
    chosen = qkinspect.heads(str(llama), **SMALL, layers=layers, heads=heads)
    assert [(r.layer, r.head) for r in chosen.records] == [
        (lay, h) for lay in (want_layers or range(3)) for h in (want_heads or range(4))]
    assert chosen.settings.layers == (want_layers and tuple(want_layers))
    assert chosen.settings.heads == (want_heads and tuple(want_heads))
    whole = {(r.layer, r.head): r for r in every_head.records}
    for r in chosen.records:
        w = whole[(r.layer, r.head)]
        assert r.kv_head == w.kv_head == r.head // 2
        for s, v in r.scores.items():
            assert (v is None and w.scores[s] is None) or v == pytest.approx(w.scores[s], abs=1e-6), (r.layer, s)
            assert (v is None) or r.errors[s] == pytest.approx(w.errors[s], abs=1e-6)
        for m, v in r.weights.items():
            assert v == pytest.approx(w.weights[m], abs=1e-6), (r.layer, r.head, m)


def test_the_relations_are_over_the_selected_heads(llama):
    from scipy.stats import spearmanr

    result = qkinspect.heads(str(llama), **SMALL, layers="1-2", heads="0-2")
    assert len(result.records) == 6
    x = [r.weights["symmetry"] for r in result.records]
    y = [r.scores["self"] for r in result.records]
    rel = result.relation("symmetry", "self")
    assert rel.n == 6 and rel.rho == pytest.approx(spearmanr(x, y).statistic)
    assert {r.layer for r in result.relations if r.scope == "layer"} == {1, 2}


def test_the_forward_pass_stops_after_the_last_selected_layer(llama, monkeypatch):
    """Hooks only on the selected layers: with layers=0 of 3, layers 1 and 2 never run; the hooks heads adds are
    gone when it returns (a forward afterwards runs none of them: each is counted through the public
    register_forward_hook), the model's own hooks are kept."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(llama)
    runs = [0, 0, 0]
    handles = [layer.self_attn.register_forward_hook(lambda m, a, out, i=i: runs.__setitem__(i, runs[i] + 1))
               for i, layer in enumerate(model.model.layers)]
    theirs: list[int] = []  # one entry each time a hook that heads registered runs
    register = torch.nn.Module.register_forward_hook

    def counted(module, hook, *args, **kwargs):
        def run(*a, **k):
            theirs.append(1)
            return hook(*a, **k)

        return register(module, run, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "register_forward_hook", counted)
    result = qkinspect.heads(model, tokenizer=str(llama), **SMALL, layers=0)
    assert runs[0] > 0 and runs[1:] == [0, 0] and theirs
    during, before = len(theirs), list(runs)
    with torch.no_grad():  # the model still runs whole afterwards, with its own hooks and none of heads'
        assert model(input_ids=torch.tensor([[5, 6, 7]])).logits.shape[1] == 3
    assert len(theirs) == during and runs == [b + 1 for b in before]
    for h in handles:
        h.remove()
    assert {r.layer for r in result.records} == {0}


def test_too_few_heads_for_rho_are_said_and_not_related(llama):
    one = qkinspect.heads(str(llama), **SMALL, layers="2", heads="1")
    assert len(one.records) == 1 and one.relations == []
    assert any("1 head selected, fewer than the 3 a rank correlation needs" in w for w in one.warnings)
    column = qkinspect.heads(str(llama), **SMALL, heads="1")  # one head a layer: no within-layer ρ
    assert column.relation("symmetry", "self").n == 3
    assert column.relation("symmetry", "self", "within").rho is None
    assert any("one head selected in each layer (heads)" in w for w in column.warnings)


@pytest.mark.parametrize("option, value, says", [
    ("layers", 3, "layers=3 is out of range; decoder has layers 0-2"),
    ("heads", "4", "heads=4 is out of range; decoder has heads 0-3"),
    ("layers", "x", "layers='x': 'x' is not an index or a range like 0-3"),
    ("heads", ["a"], "heads=['a']: every index must be an integer")])
def test_a_selection_the_model_lacks_is_refused_naming_the_argument(llama, option, value, says):
    with pytest.raises(InputError) as e:
        qkinspect.heads(str(llama), **SMALL, **{option: value})
    assert str(e.value) == says


@pytest.mark.parametrize("args", [["--layers", "3"], ["--heads", "4"], ["--layers", "1-x"], ["--heads", "2-1"]])
def test_the_cli_refuses_in_one_line_as_analyze_does(llama, args):
    runner = CliRunner()
    heads = one_error_line(runner.invoke(app, ["heads", str(llama), *args, *CLI_SMALL]), args[0])
    analyze = one_error_line(runner.invoke(app, ["analyze", str(llama), *args]), args[0])
    assert heads == analyze


def test_the_cli_selection_is_saved_said_and_read_back(llama, tmp_path):
    from qkinspect.heads.saved import read

    out = tmp_path / "h.json"
    r = CliRunner().invoke(app, ["heads", str(llama), "--layers", "0-1", "--heads", "0,2,3", *CLI_SMALL, "-o",
                                 str(out)])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["settings"]["layers"] == [0, 1] and doc["settings"]["heads"] == [0, 2, 3] and len(doc["heads"]) == 6
    assert read(out).document() == doc
    table = CliRunner().invoke(app, ["heads", str(llama), "--layers", "0-1", "--heads", "0,2,3", *CLI_SMALL,
                                     "-f", "table"], env={"COLUMNS": "80"})
    assert "ρ over the 6 selected heads (layers 0-1, heads 0,2-3)" in " ".join(table.stdout.split())
    doc["settings"]["layers"] = [0, 7]  # a selection this model cannot have
    out.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="settings.layers"):
        read(out)
