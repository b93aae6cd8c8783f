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
    ({"edits": "share_qk", "window": 128}, "^window=128: this model takes at most 64 positions$"),  # its config's
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


# -- what the config decides, in each caller's names ---------------------------------------------------------------


@pytest.fixture(scope="module")
def olmo2(tmp_path_factory):
    return tiny.olmo2(tmp_path_factory.mktemp("olmo2"))


def cli(*args: str):
    from typer.testing import CliRunner

    from qkinspect.cli.app import app

    return CliRunner().invoke(app, ["experiment", *map(str, args)])


@pytest.mark.parametrize(("kwargs", "cli_args"), [
    ({"layers": [0], "heads": [0]}, ["--layers", "0", "--heads", "0"]),  # scope head: one head at a time
    ({"scope": "head"}, []),  # every head, but each alone
    ({"scope": "layer", "heads": [0, 1]}, ["--scope", "layer", "--heads", "0,1"]),  # some heads together
])
def test_olmo2_edits_on_some_heads_are_refused_from_the_config(olmo2, no_weights, kwargs, cli_args):
    """OLMo2's q/k norm divides by one RMS over the whole projection: a one-matrix edit (or rank:K) is defined on
    every head of a layer at once, which the config says (its model_type's adapter) before any weight is read."""
    from tests.one_line import one_error_line

    for edit in ("share_qk", "symmetric", "share_qkv", "rank:2"):
        with pytest.raises(EditError, match=r"^decoder layer 0: .* on some heads only is not defined here: the q/k "
                                            r"norm divides .* edit every head of the layer together "
                                            r"\(scope='layer'\)$") as e:
            run_experiment(olmo2, edit, **kwargs)
        assert "\n" not in str(e.value)
    line = one_error_line(cli(olmo2, "--edit", "share_qk", *cli_args), "decoder layer 0: share_qk on some heads")
    assert line.endswith("edit every head of the layer together (--scope layer)")


def test_olmo2_edits_on_every_head_together_and_literal_edits_are_not_refused(olmo2, no_weights):
    for kwargs in ({"edits": "share_qk", "scope": "layer"}, {"edits": "share_qk", "scope": "model", "layers": [1]},
                   {"edits": "share_qk", "scope": "layer", "heads": [0, 1, 2, 3]}, {"edits": "tie_k,ablate"}):
        with pytest.raises(AssertionError, match="refused before any weight was read"):  # got as far as loading
            run_experiment(olmo2, window=32, **kwargs)


def test_a_model_type_the_runtime_cannot_edit_is_refused_before_any_weight_is_read(tmp_path, no_weights):
    from transformers import OPTConfig, OPTForCausalLM

    from qkinspect.errors import UnsupportedModelError

    opt = tmp_path / "opt"
    OPTForCausalLM(OPTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, ffn_dim=32,
                             vocab_size=len(tiny.VOCAB), word_embed_proj_dim=16)).save_pretrained(opt)
    with pytest.raises(UnsupportedModelError, match="'opt' cannot be run and edited"):
        run_experiment(opt, "share_qk")


def test_the_cli_names_what_the_config_refuses_with_its_options(llama, no_weights):
    from tests.one_line import one_error_line

    one_error_line(cli(llama, "--window", "128"), "error: --window 128: this model takes at most 64 positions")
    one_error_line(cli(llama, "--layers", "7"), "error: --layers: 7 is out of range; decoder has layers 0-2")


def test_the_q_k_norms_form_comes_from_the_model_types_adapter():
    from qkinspect.experiment.edits.qknorm import check_form
    from qkinspect.experiment.requests import qk_norm_form

    assert qk_norm_form("olmo2") == ("rmsnorm", "projection")
    assert qk_norm_form("qwen3") == qk_norm_form("gemma3_text") == ("rmsnorm", "head")
    assert qk_norm_form("phi")[0] == "layernorm"  # Phi's qk_layernorm: no write-back family yet, refused anyway
    with pytest.raises(EditError, match="RMSNorm q/k norms only"):
        check_form("decoder layer 0", "share_qk", "layernorm", "head", every_head=True)
    check_form("decoder layer 0", "tie_k", "layernorm", "projection", every_head=False)  # literal: defined


def test_checks_after_loading_name_the_options_as_each_caller_spells_them(llama, tmp_path, monkeypatch):
    from qkinspect.errors import CheckpointError, UnsupportedModelError
    from qkinspect.experiment import estimate
    from tests.one_line import one_error_line

    missing = tmp_path / "no_tokenizer_here"
    with pytest.raises(CheckpointError, match=r"no_tokenizer_here: no such file or folder \(tokenizer\)$"):
        run_experiment(llama, "share_qk", tokens=64, window=32, tokenizer=missing)
    one_error_line(cli(llama, "--tokens", "64", "--window", "32", "--tokenizer", missing),
                   "no_tokenizer_here: no such file or folder (--tokenizer)")
    monkeypatch.setattr(estimate, "ATTENTION", ("no_such_module",))  # a block whose attention is not found
    with pytest.raises(UnsupportedModelError, match="^estimate: cannot find the attention module"):
        run_experiment(llama, "share_qk", layers=[0], tokens=64, window=32, estimate=True)
    one_error_line(cli(llama, "--layers", "0", "--tokens", "64", "--window", "32", "--estimate"),
                   "error: --estimate: cannot find the attention module")


def test_the_values_transformers_config_checks_are_refused_before_any_weight_is_read(tmp_path, no_weights):
    """transformers' config, read from the staged checkpoint before the layers are read (runtime.staged_config)."""
    import json

    from qkinspect.errors import CheckpointError

    folder = tiny.llama(tmp_path / "llama")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "pad_token_id": 10**6}))
    with pytest.raises(CheckpointError, match="pad_token_id 1000000 is outside the vocabulary"):
        run_experiment(folder, "share_qk", tokens=64, window=32)


# -- a healing option without --heal would do nothing: refused in the caller's names (issue 39) ---------------------

@pytest.mark.parametrize(("args", "said", "verb"), [
    (["--heal-eval-every", "10"], "--heal-eval-every 10", "nothing to evaluate"),
    (["--heal-lr", "0.01"], "--heal-lr 0.01", "nothing to train"),
    (["--heal-train", "all"], "--heal-train all", "nothing to train"),
    (["--heal-batch", "64"], "--heal-batch 64", "nothing to train on"),
    (["--heal-float32"], "--heal-float32:", "nothing to train"),
    (["--heal-track", "tracks"], "--heal-track tracks", "nothing to track"),
])
def test_a_heal_option_without_heal_is_refused_before_the_model(tmp_path, args, said, verb):
    from typer.testing import CliRunner

    from qkinspect.cli.app import app
    from tests.one_line import one_error_line

    r = CliRunner().invoke(app, ["experiment", str(tmp_path / "no-such-model"), *args])
    line = one_error_line(r, said, verb, "--heal")
    assert "no such file" not in line  # refused before the model is looked for
    assert not (tmp_path / "tracks").exists()


def test_heal_options_in_the_library_names():
    from qkinspect.experiment.requests import HealOptions, heal_options

    with pytest.raises(InputError, match=r"heal.eval_every=10: without healing \(heal N .*nothing to evaluate"):
        heal_options(0, eval_every=10)
    assert heal_options(None, eval_every=None, lr=1e-4) is None  # the defaults are not "given"
    assert heal_options(5, eval_every=10) == HealOptions(steps=5, eval_every=10)
