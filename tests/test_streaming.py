"""The streaming path (sharded checkpoint, prefetch thread, cast as read, W_O skipped, shard mappings released) gives
the same numbers as the in-memory path: layers built from the whole state dict in memory, measured directly.

The checkpoint is written by bench/make_checkpoints.py (random bf16 weights, Llama names, sharded like the hub's)
with tiny shapes and tiny shards, so layers straddle shard boundaries. No timing here: that is bench/run.py's job.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import qkinspect
from qkinspect.analysis import engine as analysis
from qkinspect.layer import AttentionLayer, BlockSpec
from qkinspect.loading import open_model
from qkinspect.loading.cast import Caster
from qkinspect.loading.source import SafetensorsSource
from qkinspect.metrics.heads import HEAD_METRICS, measure_heads
from qkinspect.metrics.registry import resolve_metrics

H, G, D, LAYERS = 4, 2, 64, 3
d = D // H


def _bench_writer():
    path = Path(__file__).parents[1] / "bench" / "make_checkpoints.py"
    spec = importlib.util.spec_from_file_location("make_checkpoints", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    mk = _bench_writer()
    shape = mk.Shape(LAYERS, D, H, G, d_ff=96, vocab=50, attention_only=False)
    return mk.make(shape, tmp_path_factory.mktemp("llama") / "tiny", shard_bytes=70_000, seed=1)


@pytest.fixture(scope="module")
def state(ckpt) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def _shard_of(ckpt: Path) -> dict[str, str]:
    return json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]


def test_layers_straddle_shards(ckpt):
    """The fixture is what it claims: bf16, several shards, a layer whose q/k/v/o live in different shards, and a
    shard holding the attention of two layers."""
    where = _shard_of(ckpt)
    assert len(set(where.values())) >= 3
    spread = [len({where[f"model.layers.{i}.self_attn.{p}_proj.weight"] for p in "qkvo"}) for i in range(LAYERS)]
    assert max(spread) >= 2, spread
    layers_in = {f: {int(n.split(".")[2]) for n, g in where.items() if g == f and ".self_attn." in n}
                 for f in set(where.values())}
    assert max(len(v) for v in layers_in.values()) >= 2, layers_in
    with open_model(ckpt) as m:
        assert m.info.dtype == "bfloat16"


def memory_layer(state: dict[str, torch.Tensor], i: int) -> AttentionLayer:
    """Layer i built by hand from the in-memory state dict, as stored (bf16): nn.Linear [out, in] -> per head."""
    p = f"model.layers.{i}.self_attn"
    spec = BlockSpec("decoder", LAYERS, H, G, D, d, positional="rope", rotary_dims=d)
    return AttentionLayer(
        spec, i,
        W_Q=state[f"{p}.q_proj.weight"].reshape(H, d, D).transpose(1, 2),  # (H*d, D) -> (H, d, D) -> (H, D, d)
        W_K=state[f"{p}.k_proj.weight"].reshape(G, d, D).transpose(1, 2),  # (G*d, D) -> (G, D, d)
        W_V=state[f"{p}.v_proj.weight"].reshape(G, d, D).transpose(1, 2),
        W_O=state[f"{p}.o_proj.weight"].T.reshape(H, d, D),  # (D, H*d) -> (H*d, D) -> (H, d, D)
    )


@pytest.mark.parametrize("prefetch", [False, True])
def test_streamed_layers_equal_the_state_dict(ckpt, state, prefetch):
    with open_model(ckpt) as m:
        for layer in m.layers(prefetch=prefetch, dtype=torch.float32, need_o=False):
            ref = memory_layer(state, layer.layer)
            for name in ("W_Q", "W_K", "W_V"):
                got = getattr(layer, name)
                assert got.dtype == torch.float32 and torch.equal(got, getattr(ref, name).float()), name
            assert layer.W_O is None and layer.b_O is None


def test_analyze_streaming_equals_measuring_in_memory(ckpt, state):
    names = [n for n in resolve_metrics("all") if n in HEAD_METRICS]
    result = qkinspect.analyze(str(ckpt), metrics=["all"], spectra=["qk", "ov"])
    got = {(r.layer, r.head): r.values for r in result.heads}
    assert len(got) == LAYERS * H
    for i in range(LAYERS):
        values, spectra, _ = measure_heads(memory_layer(state, i), names, spectra=["qk", "ov"], dtype=torch.float32)
        for h in range(H):
            for n in names:
                want = values[n][h]
                assert got[(i, h)][n] == pytest.approx(want, rel=1e-6, abs=1e-9, nan_ok=True), (i, h, n)
            np.testing.assert_allclose(result.spectra[("decoder", i, h)]["qk"], spectra["qk"][h], rtol=1e-6)
            np.testing.assert_allclose(result.spectra[("decoder", i, h)]["ov"], spectra["ov"][h], rtol=1e-6)


def test_cast_in_prefetch_gives_identical_numbers(ckpt, monkeypatch):
    """Casting in the loader's thread (the default) and casting in HeadProducts (the layers as stored, no
    prefetch, W_O read) are the same arithmetic: the results are equal, not merely close."""
    streamed = qkinspect.analyze(str(ckpt))

    def as_stored(m, keys, layers, **_options):
        return m.layers(keys, layers)

    monkeypatch.setattr(analysis, "_layers", as_stored)
    stored = qkinspect.analyze(str(ckpt))
    assert streamed.metric_names == stored.metric_names
    for a, b in zip(streamed.heads, stored.heads, strict=True):
        assert (a.layer, a.head) == (b.layer, b.head)
        assert a.values.keys() == b.values.keys()
        for n, v in b.values.items():
            assert a.values[n] == v or (np.isnan(v) and np.isnan(a.values[n])), (a.layer, a.head, n)
    for x, y in zip(streamed.layers, stored.layers, strict=True):
        assert x.values == y.values


def _reads(monkeypatch) -> list[str]:
    seen: list[str] = []
    orig = SafetensorsSource._read

    def spy(self, stored_name):
        seen.append(stored_name)
        return orig(self, stored_name)

    monkeypatch.setattr(SafetensorsSource, "_read", spy)
    return seen


def test_w_o_is_read_only_when_a_metric_needs_it(ckpt, monkeypatch):
    seen = _reads(monkeypatch)
    default = qkinspect.analyze(str(ckpt))
    assert seen and not [n for n in seen if "o_proj" in n]
    assert "ov_copying" not in default.heads[0].values
    seen.clear()
    ov = qkinspect.analyze(str(ckpt), metrics=["symmetry", "ov"])
    assert len([n for n in seen if "o_proj" in n]) == LAYERS
    assert np.isfinite(ov.heads[0].values["ov_copying"])
    assert ov.heads[0].values["symmetry"] == default.heads[0].values["symmetry"]


def test_cast_layers_hold_no_shard_mapping(ckpt):
    """With a cast, each layer's shards are released right after it is read (the copies need no mapping)."""
    with open_model(ckpt) as m:
        for layer in m.layers(dtype=torch.float32):
            assert m.source._handles == {}, layer.layer
        held = [set(m.source._handles) for _ in m.layers()]  # as stored: kept until no later layer needs them
        assert any(held)


def test_analyze_leaves_torch_threads_as_it_found_them(ckpt):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        qkinspect.analyze(str(ckpt), metrics=["symmetry"])
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_cast_buffers_are_reused_only_when_free():
    cast = Caster(torch.float32, recycle=True)
    a = cast(torch.ones(3, 4, dtype=torch.bfloat16))
    b = cast(torch.full((3, 4), 2.0, dtype=torch.bfloat16))  # `a` is held: another buffer
    assert a.data_ptr() != b.data_ptr() and a.sum() == 12 and b.sum() == 24
    ptr = a.data_ptr()
    view, arr = a.T, a.numpy()
    del a
    c = cast(torch.zeros(3, 4, dtype=torch.bfloat16))  # a view and an array still use the first buffer
    assert c.data_ptr() != ptr and view.sum() == 12 and arr.sum() == 12
    del view, arr, c
    d = cast(torch.full((3, 4), 5.0, dtype=torch.bfloat16))
    assert d.data_ptr() == ptr and d.sum() == 60  # free again: reused, no fresh pages


def test_layers_kept_by_the_caller_stay_intact(ckpt, state):
    """Holding every layer (no buffer is ever free) gives the same tensors as reading them one by one."""
    with open_model(ckpt) as m:
        kept = list(m.layers(prefetch=True, dtype=torch.float32))
    for layer in kept:
        ref = memory_layer(state, layer.layer)
        for name in ("W_Q", "W_K", "W_V", "W_O"):
            assert torch.equal(getattr(layer, name), getattr(ref, name).float()), (layer.layer, name)
