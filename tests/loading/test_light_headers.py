"""Opening a checkpoint without torch: the safetensors header and the .bin pickle read by qkinspect's own readers
give what safetensors and torch.load give, refuse what they refuse, and run nothing a file names."""

from __future__ import annotations

import json
import os
import struct
import zipfile
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from qkinspect.errors import CheckpointError
from qkinspect.loading.source import read_safetensors_header
from qkinspect.loading.torchbin import TorchBinSource, read_bin_header
from tests.loading import tiny

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2,
          torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]


def _state() -> dict[str, torch.Tensor]:
    out = {f"t.{str(dt)[6:]}": torch.zeros(3, 2, dtype=dt) for dt in DTYPES}
    out["scalar"] = torch.tensor(1.5)
    out["empty"] = torch.zeros(0, 4)
    return out


def test_safetensors_header_matches_safe_open(tmp_path):
    f = tmp_path / "m.safetensors"
    save_file(_state(), str(f), metadata={"format": "pt"})
    with safe_open(str(f), framework="pt") as h:
        want = {k: (h.get_slice(k).get_dtype(), tuple(h.get_slice(k).get_shape())) for k in h.keys()}
    assert read_safetensors_header(f) == want


def test_safetensors_header_of_the_demo_model():
    from qkinspect.demo import demo_path

    f = demo_path() / "model.safetensors"
    with safe_open(str(f), framework="pt") as h:
        want = {k: (h.get_slice(k).get_dtype(), tuple(h.get_slice(k).get_shape())) for k in h.keys()}
    assert read_safetensors_header(f) == want


def _rewrite(f: Path, edit=None, length: int | None = None, tail: bytes = b"", raw: bytes | None = None) -> None:
    data = f.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    if edit is not None:
        edit(header)
    text = raw if raw is not None else json.dumps(header).encode()
    f.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data[8 + n:] + tail)


def _first(h: dict) -> dict:
    return h["t.float32"]


BAD_HEADERS = {
    "short file": lambda f: f.write_bytes(b"\x01\x00"),
    "length past the end": lambda f: _rewrite(f, length=1 << 40),
    "not JSON": lambda f: _rewrite(f, raw=b"{not json"),
    "a JSON array": lambda f: _rewrite(f, raw=b"[1, 2]"),
    "unknown dtype": lambda f: _rewrite(f, lambda h: _first(h).update(dtype="Q4")),
    "float in shape": lambda f: _rewrite(f, lambda h: _first(h).update(shape=[3.0, 2])),
    "bool in shape": lambda f: _rewrite(f, lambda h: _first(h).update(shape=[True, 2])),
    "shape and size differ": lambda f: _rewrite(f, lambda h: _first(h).update(shape=[3, 3])),
    "offsets overlap": lambda f: _rewrite(f, lambda h: _first(h).update(data_offsets=[0, 0])),
    "trailing bytes": lambda f: _rewrite(f, tail=b"\x00" * 8),
    "data cut short": lambda f: f.write_bytes(f.read_bytes()[:-4]),
    "metadata not strings": lambda f: _rewrite(f, lambda h: h.update(__metadata__={"a": 1})),
    "no data_offsets": lambda f: _rewrite(f, lambda h: _first(h).pop("data_offsets")),
}


@pytest.mark.parametrize("case", list(BAD_HEADERS))
def test_safetensors_header_refuses_what_safe_open_refuses(tmp_path, case):
    f = tmp_path / "m.safetensors"
    save_file(_state(), str(f))
    BAD_HEADERS[case](f)
    with pytest.raises(Exception):  # noqa: B017 - safetensors raises its own error types
        with safe_open(str(f), framework="pt") as h:
            [h.get_tensor(k) for k in h.keys()]
    with pytest.raises(CheckpointError, match=f"{f.name}: not a readable safetensors file, corrupt or truncated"):
        read_safetensors_header(f)


# -- .bin -------------------------------------------------------------------------------------------------------


def _bin_cases() -> dict[str, object]:
    base = torch.arange(12.0).reshape(3, 4)
    sd = OrderedDict(_state())
    sd._metadata = OrderedDict({"": {"version": 1}})  # as Module.state_dict() sets it
    return {
        "every dtype": sd,
        "views of one storage": {"w": base, "t": base.T, "row": base[1], "cols": base[:, 1:3]},
        "a parameter": {"p": torch.nn.Parameter(torch.ones(2, 5)), "b": torch.nn.Parameter(torch.zeros(5))},
        "wrapped, with non-tensors": {"state_dict": {"w": torch.ones(2, 3), "step": 7}, "epoch": 3},
        "the tiny bert": tiny.bert()[1],
    }


@pytest.mark.parametrize("case", list(_bin_cases()))
def test_bin_header_matches_torch_load(tmp_path, case):
    f = tmp_path / "x.bin"
    torch.save(_bin_cases()[case], f)
    from qkinspect.loading.torchbin import load_state_dict

    want = {k: (str(t.dtype).removeprefix("torch."), tuple(t.shape)) for k, t in load_state_dict(f).items()}
    assert read_bin_header(f) == want


def test_bin_source_sizes_without_torch_match_torch(tmp_path):
    """TorchBinSource opened from the light header: the same names, dtypes and bytes as the tensors have."""
    _, state = tiny.bert()
    state["encoder.layer.0.attention.self.query.weight"] = state["encoder.layer.0.attention.self.query.weight"].half()
    f = tmp_path / "pytorch_model.bin"
    torch.save(state, f)
    src = TorchBinSource([f])
    assert sorted(src.keys()) == sorted(state)
    for k, t in state.items():
        assert src.stored_dtype(k) == str(t.dtype).removeprefix("torch.")
        assert src.stored_nbytes(k) == t.numel() * t.element_size()
        assert torch.equal(src.get(k), t)


class Payload:
    marker: Path

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def test_bin_header_runs_nothing_the_file_names(tmp_path):
    """A global the light reader does not know sends the file to torch.load (which refuses it); nothing runs."""
    Payload.marker = tmp_path / "ran"
    f = tmp_path / "x.bin"
    torch.save({"w": torch.ones(2), "payload": Payload()}, f)
    assert read_bin_header(f) is None
    assert not Payload.marker.exists()
    with pytest.raises(CheckpointError, match=r"refused: loading it would need pickle code \(posix.mkdir\)"):
        TorchBinSource([f])
    assert not Payload.marker.exists()


def _rewritten(tmp_path: Path, old: bytes, new: bytes, record: str = "data.pkl") -> Path:
    """A torch.save file of {"w": ones(2, 3)} whose `record` has `old` replaced by `new` (the zip rebuilt, so its
    checksums stay right)."""
    src, f = tmp_path / "src.bin", tmp_path / "x.bin"
    torch.save({"w": torch.ones(2, 3)}, src)
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(f, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith("/" + record):
                assert old in data
                data = data.replace(old, new)
            zout.writestr(info, data)
    return f


ODD_BINS = {  # each would fail in torch.load, or is for torch.load to judge
    "tensor past its storage": (b"cpuq\x06K\x06t", b"cpuq\x06K\x05t"),  # 5 elements stored, 6 used
    "storage past its record": (b"cpuq\x06K\x06t", b"cpuq\x06MX\x02t"),  # 600 elements, 24 bytes on disk
    "state set on a tensor": (b"Rq\rs.", b"Rq\r}X\x05\x00\x00\x00shapeK\x01sbs."),  # BUILD {"shape": 1}
    "another global": (b"collections\nOrderedDict", b"collections\nUserDict"),
}


@pytest.mark.parametrize("case", list(ODD_BINS))
def test_bin_header_leaves_odd_files_to_torch(tmp_path, case):
    assert read_bin_header(_rewritten(tmp_path, b"", b"")) == {"w": ("float32", (2, 3))}  # unedited: read
    assert read_bin_header(_rewritten(tmp_path, *ODD_BINS[case])) is None


def test_bin_header_leaves_big_endian_and_legacy_files_to_torch(tmp_path):
    assert read_bin_header(_rewritten(tmp_path, b"little", b"big", record="byteorder")) is None
    f = tmp_path / "legacy.bin"
    torch.save({"w": torch.ones(2)}, f, _use_new_zipfile_serialization=False)
    assert read_bin_header(f) is None
    assert TorchBinSource([f]).stored_shape("w") == (2,)  # torch.load reads it
