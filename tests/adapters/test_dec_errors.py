"""Decoder checkpoints that disagree with their config are refused with the tensor's name (CheckpointError, exit 2);
prefixed checkpoints (``model.``, ``transformer.`` from the *ForCausalLM classes) load like base models."""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from qkinspect.cli.app import app
from qkinspect.errors import CheckpointError
from qkinspect.loading import open_model
from tests.adapters import test_dec_fused as fused
from tests.adapters import test_decoders as split
from tests.adapters.harness import load_layers, randomize, save_tiny


def saved(config, tmp_path, cls=tf.AutoModel):
    torch.manual_seed(0)
    model = randomize(cls.from_config(config, attn_implementation="eager"))
    return model, save_tiny(model, tmp_path / "m")


def tamper(path, name: str, new: torch.Tensor | None) -> None:
    """Replace (or, with None, drop) one stored tensor of a saved checkpoint."""
    f = path / "model.safetensors"
    sd = load_file(f)
    assert name in sd, sorted(sd)
    if new is None:
        del sd[name]
    else:
        sd[name] = new
    save_file(sd, f, metadata={"format": "pt"})


BAD = {  # case, stored name, replacement shape: required and optional tensors, split and fused layouts
    "llama k_proj": ("llama", "layers.1.self_attn.k_proj.weight", (64, 64)),  # 4 heads' rows for 2 KV heads
    "qwen2 q bias": ("qwen2", "layers.0.self_attn.q_proj.bias", (63,)),
    "gemma o_proj": ("gemma", "layers.0.self_attn.o_proj.weight", (64, 64)),  # 4 x 24 input columns expected
    "olmo2 q_norm": ("olmo2", "layers.0.self_attn.q_norm.weight", (16,)),  # (H*d,) expected: not per head
    "norm": ("llama", "layers.0.input_layernorm.weight", (32,)),
    "falcon qkv": ("falcon-gqa", "h.0.self_attention.query_key_value.weight", (96, 64)),  # an MQA layout's rows
    "gpt2 c_attn": ("gpt2", "h.1.attn.c_attn.weight", (192, 64)),  # a Linear-oriented copy of Conv1D's weight
}


def case_config(name: str):
    return (split.CASES.get(name) or fused.CASES[name]).config


@pytest.mark.parametrize("what", sorted(BAD))
def test_wrong_shape_is_refused_with_its_name(what, tmp_path):
    case, name, shape = BAD[what]
    _, path = saved(case_config(case), tmp_path)
    tamper(path, name, torch.zeros(shape))
    with pytest.raises(CheckpointError) as e:
        load_layers(path)
    msg = str(e.value)
    assert name in msg and str(tuple(shape)) in msg, msg


def test_missing_tensor_is_refused_with_its_name(tmp_path):
    _, path = saved(case_config("phi3"), tmp_path)
    tamper(path, "layers.1.self_attn.qkv_proj.weight", None)
    with pytest.raises(CheckpointError, match="qkv_proj"):
        load_layers(path)


def test_cli_one_line_exit_2(tmp_path):
    _, path = saved(case_config("mpt"), tmp_path)
    tamper(path, "blocks.0.attn.Wqkv.weight", torch.zeros(100, 64))
    r = CliRunner().invoke(app, ["analyze", str(path)])
    assert r.exit_code == 2, r.output
    assert "Wqkv" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("case, cls", [("llama", tf.AutoModelForCausalLM), ("gemma3_text", tf.AutoModelForCausalLM),
                                        ("gpt2", tf.AutoModelForCausalLM), ("falcon-mqa", tf.AutoModelForCausalLM)])
def test_causal_lm_checkpoints_match_base_model(case, cls, tmp_path):
    """A *ForCausalLM checkpoint stores the same tensors under a prefix; the layers read are the same."""
    model, path = saved(case_config(case), tmp_path, cls)
    base = tf.AutoModel.from_config(case_config(case))
    base.load_state_dict(model.base_model.state_dict())
    base_path = save_tiny(base, tmp_path / "base")
    with open_model(path) as a, open_model(base_path) as b:
        for x, y in zip(a.layers(), b.layers(), strict=True):
            for f in ("W_Q", "W_K", "W_V", "W_O"):
                assert torch.equal(getattr(x, f), getattr(y, f)), (case, x.layer, f)
