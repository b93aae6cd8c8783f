"""Which checkpoints a sweep covers, their steps, and the keys of their results (no engine needed)."""

from __future__ import annotations

import json
import os

import pytest

from qkinspect.errors import CheckpointError, InputError, ModelNotFoundError
from qkinspect.sweep import discover
from qkinspect.sweep.keys import result_key


def _ckpt(folder, **trainer_state):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"x" * 10)
    if trainer_state:
        (folder / "trainer_state.json").write_text(json.dumps(trainer_state))
    return folder


def test_steps_from_names_in_natural_order(tmp_path):
    for name in ("checkpoint-1000", "checkpoint-500", "step20", "global_step_7"):
        _ckpt(tmp_path / "run" / name)
    cks = discover([f"{tmp_path}/run/*"])
    assert [(os.path.basename(c.name), c.step, c.step_source) for c in cks] == [
        ("global_step_7", 7, "name"), ("step20", 20, "name"), ("checkpoint-500", 500, "name"),
        ("checkpoint-1000", 1000, "name")]


def test_trainer_state_wins_over_the_name(tmp_path):
    a = _ckpt(tmp_path / "checkpoint-10", global_step=99)
    b = _ckpt(tmp_path / "checkpoint-50")
    assert [(c.spec, c.step, c.step_source) for c in discover([str(a), str(b)])] == [
        (str(b), 50, "name"), (str(a), 99, "trainer_state")]


def test_without_a_step_everywhere_the_order_is_the_step(tmp_path):
    a, b, c = _ckpt(tmp_path / "zeta"), _ckpt(tmp_path / "checkpoint-5"), _ckpt(tmp_path / "alpha")
    cks = discover([str(a), str(b), str(c)])
    assert [(x.spec, x.step, x.step_source) for x in cks] == [(str(a), 0, "order"), (str(b), 1, "order"),
                                                              (str(c), 2, "order")]


def test_a_file_takes_its_folder_name_and_duplicates_go(tmp_path):
    f = _ckpt(tmp_path / "step300") / "model.safetensors"
    cks = discover([str(f), str(f), f"{tmp_path}/step300/*.safetensors"])
    assert [(c.name, c.step) for c in cks] == [(str(f), 300)]


def test_hub_revisions_are_one_checkpoint_each():
    cks = discover(["EleutherAI/pythia-160m"], ["step2000", "step1000"])
    assert [(c.name, c.revision, c.step, c.identity) for c in cks] == [
        ("EleutherAI/pythia-160m@step1000", "step1000", 1000, "hub:EleutherAI/pythia-160m@step1000"),
        ("EleutherAI/pythia-160m@step2000", "step2000", 2000, "hub:EleutherAI/pythia-160m@step2000")]


@pytest.mark.parametrize("specs, revisions, error, message", [
    (["{tmp}/nothing-*"], None, ModelNotFoundError, "the pattern matches no checkpoint"),
    (["{tmp}/missing"], None, ModelNotFoundError, "no such file or folder"),
    (["{tmp}"], ["main"], InputError, "^revisions applies to hub ids"),
    ([], None, InputError, "no checkpoints given"),
])
def test_bad_specs(tmp_path, specs, revisions, error, message):
    with pytest.raises(error, match=message):
        discover([s.format(tmp=tmp_path) for s in specs], revisions)


@pytest.mark.parametrize("state", ['{"global_step": "ten"}', "{not json", '{"global_step": -1}'])
def test_a_bad_trainer_state_names_the_file(tmp_path, state):
    folder = _ckpt(tmp_path / "checkpoint-1")
    (folder / "trainer_state.json").write_text(state)
    with pytest.raises(CheckpointError, match=f"{folder}/trainer_state.json: "):
        discover([str(folder)])


def test_result_key_follows_the_checkpoint_content_and_the_options(tmp_path):
    folder = _ckpt(tmp_path / "checkpoint-1")
    (ck,) = discover([str(folder)])
    base = result_key(ck, {"metrics": ["symmetry"]})
    assert result_key(ck, {"metrics": ["symmetry"], "precision": "float32"}) == base  # the default, spelled out
    assert result_key(ck, {"metrics": ["symmetry"], "layers": [0]}) != base
    assert result_key(ck, {"metrics": ["symmetry"], "precision": "float64"}) != base
    weights = folder / "model.safetensors"
    weights.write_bytes(b"y" * 11)  # the checkpoint was rewritten in place: its old result must not be reused
    (again,) = discover([str(folder)])
    assert again.identity != ck.identity and result_key(again, {"metrics": ["symmetry"]}) != base
    with pytest.raises(InputError, match="unknown analysis options device"):
        result_key(ck, {"device": "cuda"})
