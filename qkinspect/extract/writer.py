"""Writing a .safetensors file one tensor at a time, so that memory holds one tensor, never the whole file.

The format: an 8-byte little-endian header length N, N bytes of JSON header (each tensor's dtype, shape and
`data_offsets` relative to the data section, plus `__metadata__`: str -> str; spaces may pad its end), then the data.
A streaming writer knows the header only at the end (a layer's tensors once it is read, the metadata last), so:

- it *reserves* room for the header at the start of the file, from an upper bound on its length that the caller
  computes from what it plans to write (`header_length` of the planned entries), writes each tensor's bytes after that
  room as they come, and at the end writes the header into the room, padded with spaces;
- should the real header not fit after all (a tensor bigger than planned), it moves the data forward in place, in
  chunks from the end, to make room: still one file in constant memory, at the cost of one more pass over the data.

Why not stream the data to a temporary file and copy it behind the header at the end: that writes every byte twice
and needs twice the disk while it runs (a 70B model's attention weights alone are about 24 GB).

Example:
    >>> with open("out.safetensors", "w+b") as f:
    ...     w = SafetensorsWriter(f, reserve=256)
    ...     w.add("a", torch.ones(2, 3))
    ...     w.finish({"note": "hello"})
    >>> safetensors.torch.load_file("out.safetensors")["a"].shape
    torch.Size([2, 3])
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Iterable
from typing import BinaryIO

import torch
from torch import Tensor

# torch dtype -> the safetensors header's dtype name
DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}
WIDEST_DTYPE = max(DTYPES.values(), key=len)  # for upper bounds on the header's length
_ALIGN = 8  # the data section starts at a multiple of 8 bytes (as safetensors' own writer pads it)
_CHUNK = 1 << 24  # bytes moved at a time when the data must move to make room for the header

Entry = tuple[str, str, tuple[int, ...], int, int]  # (name, dtype name, shape, begin, end)


def header_bytes(entries: Iterable[Entry], metadata: dict[str, str]) -> bytes:
    """The JSON header, unpadded: `__metadata__` first, then the tensors in data order (as safetensors writes it).

    Example:
        >>> header_bytes([("a", "F32", (2,), 0, 8)], {"k": "v"})
        b'{"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    """
    doc: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    for name, dtype, shape, begin, end in entries:
        doc[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [begin, end]}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def header_room(length: int) -> int:
    """Bytes from the file's start to its data section for a header of `length` bytes: 8 + length, aligned."""
    return _aligned(8 + length)


class SafetensorsWriter:
    """Writes tensors to `f` (opened "w+b", empty) as they come; `finish` writes the header.

    `reserve`: bytes left at the file's start for the length and the header (`header_room` of an upper bound on the
    header's length); the data starts there. A header longer than that still works, by moving the data.
    """

    def __init__(self, f: BinaryIO, reserve: int):
        self.f = f
        self.start = _aligned(max(reserve, 8 + 2))  # the smallest header is "{}"
        self.entries: list[Entry] = []
        self._names: set[str] = set()
        self._end = 0  # bytes of data written so far
        self._finished = False

    @property
    def count(self) -> int:
        return len(self.entries)

    def add(self, name: str, t: Tensor) -> None:
        """Append one tensor's bytes (in its own dtype); nothing of it is kept once this returns."""
        if self._finished or name in self._names or name == "__metadata__":
            raise ValueError(f"cannot add tensor {name!r}: " + ("finished" if self._finished else "duplicate name"))
        if t.dtype not in DTYPES:
            raise ValueError(f"tensor {name!r}: dtype {t.dtype} has no safetensors name")
        data = _raw_bytes(t)
        self.f.seek(self.start + self._end)
        self.f.write(data)
        n = data.nbytes
        self.entries.append((name, DTYPES[t.dtype], tuple(t.shape), self._end, self._end + n))
        self._names.add(name)
        self._end += n

    def finish(self, metadata: dict[str, str]) -> None:
        """Write the length and the header in front of the data (moving the data if the header does not fit)."""
        header = header_bytes(self.entries, metadata)
        room = header_room(len(header))
        if room > self.start:
            _move_forward(self.f, self.start, self._end, room - self.start)
            self.start = room
        n = self.start - 8
        self.f.seek(0)
        self.f.write(struct.pack("<Q", n))
        self.f.write(header + b" " * (n - len(header)))
        self.f.flush()
        self._finished = True


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _raw_bytes(t: Tensor):
    """The tensor's bytes, little-endian, as a numpy uint8 array over its data (copied only if not contiguous)."""
    flat = t.detach().cpu().contiguous().reshape(-1)  # (numel,) a view of contiguous data
    data = flat.view(torch.uint8).numpy()  # (numel * itemsize,) the same memory, as bytes
    if sys.byteorder == "big" and t.element_size() > 1:
        data = data.reshape(-1, t.element_size())[:, ::-1].copy().reshape(-1)  # (numel, itemsize) reversed
    return data


def _move_forward(f: BinaryIO, start: int, length: int, by: int) -> None:
    """Move bytes [start, start + length) to start + by, from the end backwards so no byte is overwritten before
    it is read; holds one chunk at a time."""
    end = start + length
    while end > start:
        n = min(_CHUNK, end - start)
        f.seek(end - n)
        chunk = f.read(n)
        f.seek(end - n + by)
        f.write(chunk)
        end -= n
