"""`heads` runs only the base model, so a decoder checkpoint without its language-model head is complete for it:
it runs, with the same scores as the whole checkpoint; the experiment's runtime still refuses it (it measures by
the loss); a checkpoint missing part of its base model is refused by `heads` in one line naming the file."""

from __future__ import annotations

import shutil

import pytest
from safetensors.torch import load_file, save_file

import qkinspect
from qkinspect.errors import CheckpointError
from tests.experiment import tiny_models

SMALL = dict(sequences=4, length=8, windows=2, window=16, batch=4, resamples=50, permutations=50)


def _without(src, dst, drop):
    shutil.copytree(src, dst)
    state = load_file(dst / "model.safetensors")
    save_file({k: v for k, v in state.items() if not drop(k)}, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def llamas(tmp_path_factory):
    root = tmp_path_factory.mktemp("nohead")
    whole = tiny_models.llama(root / "whole")
    return {"whole": whole, "headless": _without(whole, root / "headless", lambda k: k.startswith("lm_head.")),
            "broken": _without(whole, root / "broken", lambda k: k.endswith("layers.1.mlp.up_proj.weight"))}


def test_a_decoder_without_its_lm_head_runs_with_the_same_scores(llamas):
    whole = qkinspect.heads(str(llamas["whole"]), **SMALL)
    headless = qkinspect.heads(str(llamas["headless"]), **SMALL)
    assert [r.scores for r in headless.records] == [r.scores for r in whole.records]
    assert headless.records[0].scores["induction"] is not None


def test_the_runtime_that_measures_by_the_loss_still_refuses_it(llamas):
    from qkinspect.experiment.model.runtime import load_hf
    from qkinspect.loading import open_model

    with open_model(str(llamas["headless"])) as m, pytest.raises(CheckpointError, match="lm_head"):
        load_hf(m.resolved)


def test_a_checkpoint_missing_base_weights_is_one_line_naming_the_file(llamas):
    from typer.testing import CliRunner

    from qkinspect.cli.app import app

    out = CliRunner().invoke(app, ["heads", str(llamas["broken"]), "--sequences", "4", "--length", "8",
                                   "--windows", "2", "--window", "16"])
    assert out.exit_code == 2, out.output
    lines = [x for x in out.output.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "layers.1.mlp.up_proj.weight" in lines[0] and "random values" in lines[0], out.output
    assert "loss" not in lines[0]
    assert str(llamas["broken"].name) in lines[0]
