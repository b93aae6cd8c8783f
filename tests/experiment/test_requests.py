"""An experiment's request is checked once, in the library, in the caller's option names, and what the model's
description (its config) already refuses is refused before any weight is read or the model is loaded."""

from __future__ import annotations

import pytest

from qkinspect.errors import InputError
from qkinspect.experiment import run_experiment
from qkinspect.experiment.edits.names import EditError
from qkinspect.experiment.requests import CLI_NAMES, LIBRARY_NAMES, check_request
from qkinspect.loading.model import LoadedModel
from tests.experiment import tiny_models as tiny


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny.llama(tmp_path_factory.mktemp("llama"))


@pytest.fixture
def no_weights(monkeypatch):
    """Reading a layer's tensors or loading the model with transformers fails the test."""
    from qkinspect.experiment.model import in_memory, runtime

    def never(*args, **kwargs):
        raise AssertionError("the request should have been refused before any weight was read")

    monkeypatch.setattr(LoadedModel, "layer", never)
    monkeypatch.setattr(LoadedModel, "layers", never)
    monkeypatch.setattr(runtime, "load_hf", never)
    monkeypatch.setattr(in_memory, "hf_in_memory", never)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"edits": "rank:99"}, "rank:99 needs 0 <= K <= d_head = 16"),  # the block's head width, from the config
    ({"edits": "share_qk", "layers": [7]}, "layers=7 is out of range; decoder has layers 0-2"),
    ({"edits": "share_qk", "heads": [4]}, "heads=4 is out of range; decoder has heads 0-3"),
])
def test_what_the_config_refuses_is_refused_before_any_weight_is_read(llama, no_weights, kwargs, message):
    with pytest.raises(InputError, match=message):
        run_experiment(llama, **kwargs)


def test_the_edit_refusal_names_the_first_chosen_layer_as_the_run_would(llama, no_weights):
    with pytest.raises(EditError, match="^decoder layer 2: rank:17"):
        run_experiment(llama, "share_qk,rank:17", layers=[2])


@pytest.mark.parametrize(("kwargs", "library", "cli"), [
    ({"tokens": 1}, "tokens=1 / window=512: both", "--tokens 1 / --window 512: both"),
    ({"scope": "layer", "estimate": True}, "estimate estimates heads one by one: use it with scope='head'",
     "--estimate estimates heads one by one: use it with --scope head"),
    ({"verify": 3}, "verify applies to estimate only", "--verify applies to --estimate only"),
    ({"estimate": True, "probes": 1}, "probes=1: expected 2 to 4096", "--probes 1: expected 2 to 4096"),
    ({"heal": 2, "estimate": True}, "heal runs every edit exactly: it cannot be combined with estimate",
     "--heal runs every edit exactly: it cannot be combined with --estimate"),
    ({"heal": 2, "rotary": "offset0"}, "use rotary='gauge'", "use --rotary gauge"),
    ({"rotary": "sideways"}, "rotary='sideways': expected gauge or offset0", "--rotary sideways: expected"),
])
def test_each_option_is_named_as_the_caller_spells_it(kwargs, library, cli):
    args = {"scope": "head", "rotary": "gauge", "tokens": 4096, "window": 512, "estimate": False, "probes": None,
            "verify": None, "heal": None, "device": None, **kwargs}
    for names, message in ((LIBRARY_NAMES, library), (CLI_NAMES, cli)):
        with pytest.raises(InputError) as e:
            check_request("share_qk", names=names, **args)
        assert message in str(e.value)


def test_a_checked_request_keeps_each_edit_once_and_the_default_verification():
    r = check_request("share_qk,rank:8,share_qk", scope="head", rotary="gauge", tokens=64, window=32,
                      estimate=True, probes=None, verify=None, heal=None, device="cpu")
    assert [str(e) for e in r.edits] == ["share_qk", "rank:8"] and r.verify == 12 and r.device == "cpu"
    assert r.heal is None
