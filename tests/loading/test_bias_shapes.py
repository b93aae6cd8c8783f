"""Bias and norm shapes are checked where they enter, like every weight (issue 25 class 9): a tensor the config
does not imply is one `error:` line naming the checkpoint and the tensor, exit 2, in `analyze` and `extract`."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from qkinspect.cli.app import app
from tests.loading import tiny


def one_error_line(r, *says: str) -> str:
    assert r.exit_code == 2, (r.exit_code, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and r.stdout == "", r.stderr
    assert all(s in lines[0] for s in says), lines[0]
    return lines[0]


def commands(spec, tmp_path):
    yield CliRunner().invoke(app, ["analyze", str(spec), "--metrics", "symmetry", "--format", "json"])
    out = tmp_path / "x.safetensors"
    yield CliRunner().invoke(app, ["extract", str(spec), "-o", str(out)])
    assert not out.exists()


BERT_TENSORS = ["attention.self.query.bias", "attention.self.key.bias", "attention.self.value.bias",
                "attention.output.dense.bias"]


@pytest.mark.parametrize("name", BERT_TENSORS + ["norm.weight", "norm.bias"])
@pytest.mark.parametrize("size", [7, 64, 0])
def test_bert_bias_and_norm_of_the_wrong_length(tmp_path, name, size):
    config, state = tiny.bert()
    key = "encoder.layer.0.output.LayerNorm." + name.split(".")[1] if name.startswith("norm.") \
        else f"encoder.layer.1.{name}"
    assert key in state and state[key].shape == (32,)
    state[key] = torch.randn(size)
    folder = tiny.write(tmp_path / "m", config, state)
    for r in commands(folder, tmp_path):
        one_error_line(r, str(folder), repr(key), f"has shape ({size},)", "the config implies (32,)")


def test_bias_with_two_dimensions(tmp_path):
    config, state = tiny.bert()
    key = "encoder.layer.0.attention.self.query.bias"
    state[key] = torch.randn(4, 8)  # the right count, the wrong shape
    folder = tiny.write(tmp_path / "m", config, state)
    for r in commands(folder, tmp_path):
        one_error_line(r, str(folder), repr(key), "has shape (4, 8)")


def test_llama_bias_of_the_wrong_length(tmp_path):
    config, state = tiny.llama()
    key = "layers.0.self_attn.k_proj.bias"
    state[key] = torch.randn(5)
    folder = tiny.write(tmp_path / "m", config, state)
    for r in commands(folder, tmp_path):
        one_error_line(r, str(folder), "self_attn.k_proj.bias", "has shape (5,)")
