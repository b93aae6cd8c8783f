"""Bias and norm shapes are checked where they enter, like every weight (issue 25 classes 9 and 10): a tensor
the config does not imply is one `error:` line naming the checkpoint and the tensor, exit 2, in `analyze` and
`extract`, for folders and GGUF files alike; Falcon's key/value heads must divide its heads."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from qkinspect.cli.app import app
from tests.loading import gguf_convert, tiny
from tests.one_line import one_error_line


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


def gguf_with(tmp_path, monkeypatch, case: str, role: str, cut: int = 1):
    """`case`'s tiny model converted to GGUF, the first layer's `role` tensor (a Hugging Face name suffix) cut short
    by `cut` values after conversion."""
    real = gguf_convert.converted

    def shortened(case_, name, t, config):
        out = real(case_, name, t, config)
        return [(n, v[:-cut] if ".0." in n and n.endswith(role) else v) for n, v in out]

    monkeypatch.setattr(gguf_convert, "converted", shortened)
    config, model = gguf_convert.tiny_model(case)
    return gguf_convert.write_gguf(tmp_path / f"{case}.gguf", case, config, model)


@pytest.mark.parametrize("case, role", [("qwen2moe", "q_proj.bias"), ("qwen2", "k_proj.bias"),
                                        ("bloom", "query_key_value.bias"), ("bloom", "query_key_value.weight"),
                                        ("falcon", "query_key_value.weight"), ("stablelm", "v_proj.bias")])
def test_gguf_bias_and_fused_shapes_name_the_file(tmp_path, monkeypatch, case, role):
    path = gguf_with(tmp_path, monkeypatch, case, role)
    for r in commands(path, tmp_path):
        one_error_line(r, str(path))


def test_falcon_kv_heads_must_divide_the_heads(tmp_path, monkeypatch):
    import gguf

    config, model = gguf_convert.tiny_model("falcon")
    path = gguf_convert.write_gguf(tmp_path / "f.gguf", "falcon", config, model)
    reader = gguf.GGUFReader(str(path), "r+")
    field = reader.fields["falcon.attention.head_count_kv"]
    field.parts[field.data[0]][0] = 3  # 4 heads in 3 groups
    del reader
    for r in commands(path, tmp_path):
        one_error_line(r, str(path), "num_attention_heads (4) is not a multiple of num_kv_heads (3)")
