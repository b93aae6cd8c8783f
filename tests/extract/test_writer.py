"""The streaming safetensors writer: whatever the tensors and the room reserved for the header, safetensors reads
back exactly what was added, with the metadata; a header longer than its room moves the data, chunk by chunk."""

from __future__ import annotations

import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import load_file

from qkinspect.extract import writer as safetensors_writer
from qkinspect.extract.writer import DTYPES, SafetensorsWriter, header_bytes, header_room

FLOATS = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
SHAPES = st.lists(st.integers(0, 5), min_size=0, max_size=3)


def _tensor(seed: int, shape: list[int], dtype: torch.dtype, transposed: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=g).to(dtype)
    return t.T if transposed and t.dim() == 2 else t  # a non-contiguous view must be written in logical order


def _write(path, tensors: dict[str, torch.Tensor], metadata: dict[str, str], reserve: int) -> SafetensorsWriter:
    with open(path, "w+b") as f:
        w = SafetensorsWriter(f, reserve=reserve)
        for name, t in tensors.items():
            w.add(name, t)
        w.finish(metadata)
    return w


@settings(max_examples=40, deadline=None)
@given(specs=st.lists(st.tuples(SHAPES, st.sampled_from(FLOATS), st.booleans()), min_size=1, max_size=6),
       reserve=st.integers(0, 600), chunk=st.sampled_from([1, 3, 64, 1 << 24]),
       note=st.text(max_size=20))
def test_reads_back_what_was_written(tmp_path_factory, specs, reserve, chunk, note):
    path = tmp_path_factory.mktemp("w") / "x.safetensors"
    tensors = {f"t.{k}": _tensor(k, shape, dtype, tr) for k, (shape, dtype, tr) in enumerate(specs)}
    metadata = {"note": note, "schema": "qkinspect/1"}
    old_chunk = safetensors_writer._CHUNK
    safetensors_writer._CHUNK = chunk  # small chunks: the move overlaps itself, as on a big file
    try:
        w = _write(path, tensors, metadata, reserve)
    finally:
        safetensors_writer._CHUNK = old_chunk
    assert w.count == len(tensors)
    back = load_file(path)
    assert set(back) == set(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape
        assert torch.equal(back[name], t), name
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == metadata
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    assert n % 8 == 0 and 8 + n == w.start


def test_room_that_fits_is_used_as_is(tmp_path):
    tensors = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(4, dtype=torch.bfloat16)}
    entries = [("a", "F32", (2, 3), 0, 24), ("b", "BF16", (4,), 24, 32)]
    exact = header_room(len(header_bytes(entries, {"k": "v"})))
    for reserve, start in [(exact + 64, exact + 64), (exact, exact), (exact - 8, exact)]:
        w = _write(tmp_path / "x.safetensors", tensors, {"k": "v"}, reserve)
        assert w.start == start  # room to spare: padded with spaces; too little: the data moved to `exact`
        raw = (tmp_path / "x.safetensors").read_bytes()
        assert len(raw) == start + 32 and raw[8:start].rstrip(b" ") == header_bytes(entries, {"k": "v"})


def test_header_is_safetensors_own_layout():
    assert header_bytes([("a", "F32", (2,), 0, 8)], {"k": "v"}) == (
        b'{"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}')
    assert set(DTYPES.values()) >= {"F32", "BF16", "F16", "F64"}


def test_refuses_duplicates_and_unknown_dtypes(tmp_path):
    with open(tmp_path / "x.safetensors", "w+b") as f:
        w = SafetensorsWriter(f, reserve=64)
        w.add("a", torch.ones(2))
        with pytest.raises(ValueError, match="duplicate"):
            w.add("a", torch.ones(2))
        with pytest.raises(ValueError, match="no safetensors name"):
            w.add("c", torch.ones(2, dtype=torch.complex64))
        w.finish({})
        with pytest.raises(ValueError, match="finished"):
            w.add("d", torch.ones(2))
    assert set(load_file(tmp_path / "x.safetensors")) == {"a"}
