"""`qkinspect extract` streams: the file equals what the in-memory writer (the previous implementation, kept here as
the reference) wrote, memory holds about two layers, and a failure midway leaves neither output nor temporary file."""

from __future__ import annotations

import gc
import json
import os
import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from qkinspect.documents import envelope, model_dict
from qkinspect.errors import CheckpointError
from qkinspect.extract import writer as safetensors_writer
from qkinspect.extract.run import CONVENTION, TENSORS, extract_heads
from qkinspect.loading import open_model
from qkinspect.loading.model import LoadedModel

N_LAYERS = 8


def extract_in_memory(model, output: Path, layers=None, blocks=None) -> None:
    """The previous `extract`: every selected layer's tensors cloned into one dict, saved at the end."""
    tensors, written = {}, []
    with open_model(None if model is None else str(model)) as m:
        for block, i in m.plan(blocks, layers):
            layer = m.layer(block, i)
            shapes = {}
            for name in TENSORS:
                t = getattr(layer, name)
                if t is not None:
                    tensors[f"{layer.block}.{layer.layer}.{name}"] = t.detach().contiguous().clone()
                    shapes[name] = list(t.shape)
            written.append({"block": layer.block, "layer": layer.layer, "source_layer": layer.source_layer,
                            "shapes": shapes})
        meta = envelope("extract", model=model_dict(m.info), convention=CONVENTION, layers=written)
    save_file(tensors, str(output), metadata={"qkinspect": json.dumps(meta), "schema": meta["schema"]})


@pytest.fixture(scope="module")
def sharded_llama(tmp_path_factory):
    """bf16, GQA, eight layers over several shards (some layers straddle two)."""
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(5)
    cfg = LlamaConfig(vocab_size=40, hidden_size=64, intermediate_size=96, num_hidden_layers=N_LAYERS,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)
    path = tmp_path_factory.mktemp("llama_bf16")
    LlamaModel(cfg).to(torch.bfloat16).eval().save_pretrained(path, safe_serialization=True, max_shard_size="60KB")
    assert len(list(path.glob("*.safetensors"))) >= 3
    return path


@pytest.fixture(scope="module")
def tiny_albert(tmp_path_factory):
    """Every layer shares one set of weights (the previous writer had to clone them apart)."""
    from transformers import AlbertConfig, AlbertModel

    torch.manual_seed(6)
    cfg = AlbertConfig(vocab_size=40, embedding_size=16, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                       intermediate_size=64, max_position_embeddings=16)
    path = tmp_path_factory.mktemp("albert")
    AlbertModel(cfg).eval().save_pretrained(path, safe_serialization=True)
    return path


def assert_same_file(got: Path, want: Path) -> None:
    """Same tensors (names, dtypes, shapes, values) and same metadata, read by load_file and by safe_open."""
    a, b = load_file(got), load_file(want)
    assert list(sorted(a)) == list(sorted(b))
    for k in b:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), k
    with safe_open(str(got), "pt") as f, safe_open(str(want), "pt") as g:
        assert f.metadata() == g.metadata()
        assert sorted(f.keys()) == sorted(g.keys())
        for k in g.keys():
            assert torch.equal(f.get_tensor(k), g.get_tensor(k)), k
    assert_well_formed(got)


def assert_well_formed(path: Path) -> None:
    """The header's length is a multiple of 8, it is JSON padded with spaces, and the data offsets tile the data."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    text = raw[8:8 + n].decode("utf-8")
    assert text.rstrip(" ").endswith("}") and set(text[len(text.rstrip(" ")):]) <= {" "}
    header = json.loads(text)
    spans = sorted(v["data_offsets"] for k, v in header.items() if k != "__metadata__")
    assert spans[0][0] == 0 and spans[-1][1] == len(raw) - 8 - n
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))


@pytest.mark.parametrize("model, layers", [("demo", None), ("sharded_llama", None), ("sharded_llama", (1, 6)),
                                           ("tiny_albert", None), ("tiny_bart", None)])
def test_streamed_file_equals_in_memory_file(cli, monkeypatch, request, tmp_path, model, layers):
    def no_room(*args):
        raise AssertionError("the header room planned from the model's shapes was too small")

    monkeypatch.setattr(safetensors_writer, "_move_forward", no_room)
    spec = None if model == "demo" else request.getfixturevalue(model)
    args = [] if spec is None else [spec]
    if layers:
        args += ["--layers", ",".join(map(str, layers))]
    r = cli("extract", *args, "-o", tmp_path / "stream.safetensors")
    assert r.exit_code == 0, r.stderr
    extract_in_memory(spec, tmp_path / "memory.safetensors", layers=layers)
    assert_same_file(tmp_path / "stream.safetensors", tmp_path / "memory.safetensors")
    assert sorted(os.listdir(tmp_path)) == ["memory.safetensors", "stream.safetensors"]  # no temporary file left


def test_bf16_stays_bf16(sharded_llama, tmp_path):
    out = tmp_path / "h.safetensors"
    n = extract_heads(str(sharded_llama), out)
    tensors = load_file(out)
    assert n == len(tensors) == 4 * N_LAYERS
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    with open_model(sharded_llama) as m:
        assert m.layer("decoder", 0).W_Q.dtype == torch.bfloat16  # what the previous writer saved, as read
        assert torch.equal(tensors["decoder.3.W_K"], m.layer("decoder", 3).W_K)


def _live_tensor_bytes(baseline: set[int]) -> int:
    """Bytes of the tensor storages alive now that were not alive at `baseline` (each storage counted once)."""
    seen: dict[int, int] = {}
    for o in gc.get_objects():
        if issubclass(type(o), torch.Tensor) and not o.is_meta:  # type(): no __class__ lookups
            s = o.untyped_storage()
            if s.data_ptr() not in baseline:
                seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def _peak_while_reading(monkeypatch, run) -> int:
    """The most tensor bytes alive when any layer has just been read (old and new writers both read via _layer)."""
    baseline = {o.untyped_storage().data_ptr() for o in gc.get_objects()
                if issubclass(type(o), torch.Tensor)}
    peaks = []
    read = LoadedModel._layer

    def measured(self, *args, **kwargs):
        layer = read(self, *args, **kwargs)
        peaks.append(_live_tensor_bytes(baseline))
        return layer

    monkeypatch.setattr(LoadedModel, "_layer", measured)
    run()
    assert len(peaks) == N_LAYERS
    return max(peaks)


def test_memory_holds_about_two_layers(monkeypatch, sharded_llama, tmp_path):
    """Two layers (the one being written, the one prefetched) and one tensor's contiguous copy at most; the
    in-memory writer holds all eight by its last read, so this bound tells the two apart."""
    with open_model(sharded_llama) as m:
        layer_bytes = m.info.attention_bytes // N_LAYERS
    bound = 3 * layer_bytes
    streamed = _peak_while_reading(monkeypatch, lambda: extract_heads(str(sharded_llama), tmp_path / "a.safetensors"))
    in_memory = _peak_while_reading(monkeypatch,
                                    lambda: extract_in_memory(sharded_llama, tmp_path / "b.safetensors"))
    assert streamed <= bound, (streamed, layer_bytes)
    assert in_memory > bound, (in_memory, layer_bytes)  # the measurement would catch the previous writer


@pytest.mark.parametrize("error", [CheckpointError("shard 2 is truncated"), KeyboardInterrupt()])
def test_failure_midway_leaves_no_file(cli, monkeypatch, sharded_llama, tmp_path, error):
    read = LoadedModel._layer
    calls = []

    def failing(self, block, layer, *args):
        calls.append(layer)
        if layer == 4:
            raise error
        return read(self, block, layer, *args)

    monkeypatch.setattr(LoadedModel, "_layer", failing)
    r = cli("extract", sharded_llama, "-o", tmp_path / "h.safetensors")
    assert r.exit_code == (2 if isinstance(error, CheckpointError) else 130), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert "truncated" in r.stderr if isinstance(error, CheckpointError) else "interrupted" in r.stderr
    assert 4 in calls and os.listdir(tmp_path) == []


def test_failure_keeps_the_previous_file(cli, monkeypatch, tiny_bert, tmp_path):
    out = tmp_path / "h.safetensors"
    out.write_bytes(b"previous")

    def failing(self, block, layer, *args):
        raise CheckpointError("cannot read")

    monkeypatch.setattr(LoadedModel, "_layer", failing)
    assert cli("extract", tiny_bert, "-o", out).exit_code == 2
    assert out.read_bytes() == b"previous" and os.listdir(tmp_path) == ["h.safetensors"]
