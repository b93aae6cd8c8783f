"""GGUF: names, config from metadata, dequantisation, and the proof that llama.cpp's q/k permutation is undone."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkinspect.errors import CheckpointError, InputError, UnsupportedModelError
from qkinspect.loading import open_model, supported_model_types
from qkinspect.loading.gguf import hf_name, open_gguf, unpermute_rows
from tests.loading import tiny

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj")


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 6), half=st.integers(1, 5), D=st.integers(1, 7), bias=st.booleans())
def test_unpermute_inverts_llama_cpp_permute(n, half, D, bias):
    shape = (n * 2 * half,) if bias else (n * 2 * half, D)
    w = torch.randn(shape)
    permuted = tiny.llama_cpp_permute(w, n, n)
    assert torch.equal(unpermute_rows(permuted, n), w)
    assert torch.equal(tiny.unpermute_by_index(permuted, n), w)  # the test's own row-by-row inverse agrees


def test_unpermute_refuses_odd_head_width():
    with pytest.raises(CheckpointError, match="9 rows for 3 heads"):
        unpermute_rows(torch.zeros(9, 4), 3)


@pytest.mark.parametrize(("name", "hf"), [
    ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),
    ("blk.12.attn_k.bias", "model.layers.12.self_attn.k_proj.bias"),
    ("blk.3.attn_v.weight", "model.layers.3.self_attn.v_proj.weight"),
    ("blk.3.attn_output.weight", "model.layers.3.self_attn.o_proj.weight"),
    ("blk.3.attn_norm.weight", "model.layers.3.input_layernorm.weight"),
    ("blk.3.attn_q_norm.weight", "model.layers.3.self_attn.q_norm.weight"),
    ("blk.3.ffn_up.weight", None), ("token_embd.weight", None), ("output_norm.weight", None),
])
def test_gguf_names(name, hf):
    assert hf_name(name) == hf


@pytest.fixture(scope="module")
def llama_gguf(tmp_path_factory):
    """A tiny random Llama saved by save_pretrained, and the same weights converted to GGUF as llama.cpp does."""
    tmp = tmp_path_factory.mktemp("llama")
    config, state = tiny.llama()
    folder = tiny.write(tmp / "hf", config, state)
    return config, state, folder, tiny.write_gguf(tmp / "tiny.gguf", config, state)


def test_gguf_returns_the_original_hf_matrices_exactly(llama_gguf):
    config, state, _, path = llama_gguf
    _, src = open_gguf(path)
    for i in range(config.num_hidden_layers):
        for proj in PROJ:
            name = f"layers.{i}.self_attn.{proj}.weight"
            got = src.get(name)
            assert got.dtype == torch.float32 and torch.equal(got, state[name]), name
        norm = f"layers.{i}.input_layernorm.weight"
        assert torch.equal(src.get(norm), state[norm])
    q = "layers.0.self_attn.q_proj.weight"
    assert not np.array_equal(src._tensors["model." + q].data, state[q].numpy())  # the file really is permuted


def test_gguf_config_from_metadata(llama_gguf):
    config, _, _, path = llama_gguf
    got, _ = open_gguf(path)
    assert got.model_type == "llama" and got.architectures == ["LlamaForCausalLM"]
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "intermediate_size", "vocab_size", "max_position_embeddings"):
        assert getattr(got, key) == getattr(config, key), key
    assert got.rms_norm_eps == pytest.approx(config.rms_norm_eps)
    assert got.rope_parameters["rope_theta"] == config.rope_parameters["rope_theta"]
    assert "partial_rotary_factor" not in got.rope_parameters


@pytest.mark.skipif("llama" not in supported_model_types(), reason="no llama adapter registered")
def test_gguf_layers_equal_safetensors_layers(llama_gguf):
    _, _, folder, path = llama_gguf
    with open_model(folder) as a, open_model(path) as b:
        assert b.info.format == "gguf" and b.info.dtype == "float32"
        assert b.info.attention_bytes == a.info.attention_bytes
        assert a.info.blocks == b.info.blocks
        for x, y in zip(a.layers(), b.layers(), strict=True):
            for name in ("W_Q", "W_K", "W_V", "W_O"):
                assert torch.equal(getattr(x, name), getattr(y, name)), (x.layer, name)
            assert torch.equal(x.norm_q.weight, y.norm_q.weight)


def test_gguf_quantised_q8_0(tmp_path):
    """Q8_0: the loader's result is the dequantised file un-permuted, and close to the original weights."""
    config, state = tiny.llama()
    path = tiny.write_gguf(tmp_path / "q8.gguf", config, state, qtype=gguf.GGMLQuantizationType.Q8_0)
    _, src = open_gguf(path)
    H, G = config.num_attention_heads, config.num_key_value_heads
    for proj, n in (("q_proj", H), ("k_proj", G)):
        name = f"layers.1.self_attn.{proj}.weight"
        raw = src._tensors["model." + name]
        assert src.stored_dtype("model." + name) == "q8_0"
        deq = torch.from_numpy(gguf.quants.dequantize(raw.data, raw.tensor_type).copy())
        got = src.get(name)
        assert torch.equal(got, tiny.unpermute_by_index(deq, n))
        assert (got - state[name]).abs().max() < 0.02 * state[name].abs().max()


def test_gguf_qwen2_is_not_permuted_and_keeps_biases(tmp_path):
    """llama.cpp converts Qwen2 without the permutation (NeoX-style rope): rows stay as in Hugging Face."""
    config, state = tiny.llama()
    H, G, d, D = 4, 2, 16, 64
    state.update({"layers.0.self_attn.q_proj.bias": torch.randn(H * d), "layers.0.self_attn.k_proj.bias":
                  torch.randn(G * d), "layers.0.self_attn.v_proj.bias": torch.randn(G * d)})
    path = tiny.write_gguf(tmp_path / "qwen2.gguf", config, state, arch="qwen2", permute=False)
    cfg, src = open_gguf(path)
    assert cfg.model_type == "qwen2" and (cfg.hidden_size, cfg.num_key_value_heads) == (D, G)
    for name in ("layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight",
                 "layers.0.self_attn.q_proj.bias", "layers.0.self_attn.k_proj.bias"):
        assert torch.equal(src.get(name), state[name]), name


def test_gguf_llama_biases_are_unpermuted(tmp_path):
    config, state = tiny.llama(attention_bias=True)
    path = tiny.write_gguf(tmp_path / "b.gguf", config, state)
    cfg, src = open_gguf(path)
    assert cfg.attention_bias is True
    for name in ("layers.0.self_attn.q_proj.bias", "layers.0.self_attn.k_proj.bias"):
        assert torch.equal(src.get(name), state[name]), name


def test_gguf_partial_rotary(tmp_path):
    config, state = tiny.llama()
    path = tmp_path / "p.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for add, v in (("block_count", 1), ("embedding_length", 64), ("head_count", 4), ("rope_dimension_count", 8)):
        getattr(w, f"add_{add}")(v)
    w.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    cfg, _ = open_gguf(path)
    assert (cfg.head_dim, cfg.num_key_value_heads) == (16, 4)
    assert cfg.rope_parameters["partial_rotary_factor"] == 0.5


# -- bad GGUF files ---------------------------------------------------------------------------------------------


def _bad(tmp_path, kind):
    config, state = tiny.llama()
    path = tmp_path / "bad.gguf"
    if kind == "garbage":
        path.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    elif kind == "not-gguf":
        path.write_bytes(b"hello" * 100)
    elif kind == "truncated":
        tiny.write_gguf(path, config, state)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) - 1000])
    elif kind == "arch":
        tiny.write_gguf(path, config, state, arch="rwkv6")
    elif kind == "no-metadata":
        tiny.write_gguf(path, config, state, meta=False)
    return path


@pytest.mark.parametrize(("kind", "error", "pattern"), [
    ("garbage", CheckpointError, "bad.gguf: not a readable GGUF file"),
    ("not-gguf", CheckpointError, "bad.gguf: not a readable GGUF file"),
    ("truncated", CheckpointError, "bad.gguf: (not a readable GGUF file|truncated)"),
    ("arch", UnsupportedModelError, "GGUF architecture 'rwkv6' is not supported; supported: .*llama, .*qwen2"),
    ("no-metadata", CheckpointError, "GGUF metadata has no 'llama.embedding_length'"),
])
def test_bad_gguf(tmp_path, kind, error, pattern):
    path = _bad(tmp_path, kind)
    before = tiny.tree(tmp_path)
    with pytest.raises(error, match=pattern) as e:
        open_model(path)
    assert isinstance(e.value, InputError) and "\n" not in str(e.value)
    assert tiny.tree(tmp_path) == before
