"""Tensor sources: read named tensors one at a time from a checkpoint, never the whole file.

A source knows every tensor's shape, storage dtype and stored size from the file headers, so the loader can check a
checkpoint against its config and total the attention bytes before reading any data. Sharded sources open a shard
when a tensor in it is first read and close it again on `release`, so the loader can drop each shard's mapping once
no later layer needs it.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Hashable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qkinspect.errors import CheckpointError, one_line
from qkinspect.loading.checked import inside, read_json
from qkinspect.reading import os_reason

if TYPE_CHECKING:  # torch is imported where tensors are read, not to open a checkpoint (`qkinspect info`)
    import torch
    from torch import Tensor

# safetensors header dtype -> torch's name for it: the storage dtype of a tensor, as stored (those torch reads).
_SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}
# Bits per element of every dtype the safetensors format defines (those above and those torch cannot read), for
# checking a header's offsets as safetensors itself does.
_SAFETENSORS_BITS = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64,
    "I64": 64, "U64": 64,
}
_MAX_HEADER = 100_000_000  # safetensors' own limit on the JSON header's size


class TensorSource:
    """Named tensors of a checkpoint. Names may carry a base-model prefix (``bert.``, ``model.``);
    `resolve` maps an adapter's unprefixed name to the stored one.

    Subclasses implement `keys`, `_read`, `stored_shape`, `stored_dtype` and `stored_nbytes`; sharded ones also
    `shard_of` and `release`.
    """

    def keys(self) -> list[str]:
        raise NotImplementedError

    def _read(self, stored_name: str) -> Tensor:
        raise NotImplementedError

    def stored_shape(self, stored_name: str) -> tuple[int, ...]:
        raise NotImplementedError

    def stored_dtype(self, stored_name: str) -> str:
        """Storage dtype as a short name: ``float32``, ``bfloat16``, or a GGML type such as ``q4_1``."""
        raise NotImplementedError

    def stored_nbytes(self, stored_name: str) -> int:
        """Bytes the tensor takes in the file, from the header alone."""
        raise NotImplementedError

    def shard_of(self, stored_name: str) -> Hashable | None:
        """The shard (file) holding a tensor, or None for single-mapping sources."""
        return None

    def release(self, shard: Hashable) -> None:
        """Close one shard's handle and mapping; a later read opens it again."""

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- name resolution -------------------------------------------------------------------------
    _prefix: str | None = None

    def resolve(self, name: str) -> str | None:
        keys = self._key_set()
        if self._prefix is not None and self._prefix + name in keys:
            return self._prefix + name
        if name in keys:
            return name
        # Find the prefix once from the first name that needs one, e.g. "bert." or "model.".
        for k in keys:
            if k.endswith("." + name):
                self._prefix = k[: -len(name)]
                return k
        return None

    def _key_set(self) -> set[str]:
        if not hasattr(self, "_keys_cache"):
            self._keys_cache = set(self.keys())
        return self._keys_cache

    def get(self, name: str) -> Tensor | None:
        stored = self.resolve(name)
        return None if stored is None else self._read(stored)

    def shape(self, name: str) -> tuple[int, ...] | None:
        stored = self.resolve(name)
        return None if stored is None else self.stored_shape(stored)


class ShardedSource(TensorSource):
    """A checkpoint split over files: which file holds each tensor (`_where`) and its stored dtype and shape
    (`_meta`), learnt from the files' headers up front. Subclasses fill both in `__init__` and read data."""

    _where: dict[str, Path]
    _meta: dict[str, tuple[object, tuple[int, ...]]]  # name -> (stored dtype, shape)

    @classmethod
    def from_index(cls, index: Path):
        return cls(shards_from_index(index))

    def keys(self) -> list[str]:
        return list(self._where)

    def stored_shape(self, stored_name: str) -> tuple[int, ...]:
        return self._meta[stored_name][1]

    def shard_of(self, stored_name: str) -> Path:
        return self._where[stored_name]


class SafetensorsSource(ShardedSource):
    """One or more .safetensors files (a sharded checkpoint lists them in model.safetensors.index.json).

    Every file's header is read and checked up front (a truncated or corrupt file fails here, naming the file);
    data is read with `safe_open`, one tensor at a time.

    Example:
        >>> src = SafetensorsSource([Path("model.safetensors")])  # doctest: +SKIP
        >>> src.get("encoder.layer.0.attention.self.query.weight").shape  # doctest: +SKIP
        torch.Size([384, 384])
    """

    def __init__(self, files: Iterable[Path]):
        self.files = [Path(f) for f in files]
        self._handles: dict[Path, object] = {}
        self._where: dict[str, Path] = {}
        self._meta: dict[str, tuple[str, tuple[int, ...]]] = {}  # name -> (header dtype, shape)
        for f in self.files:
            for k, (dtype, shape) in read_safetensors_header(f).items():
                self._where[k] = f
                self._meta[k] = (dtype, shape)
        # the data is mapped with `safe_open` on the first read from each file

    def stored_dtype(self, stored_name: str) -> str:
        raw = self._meta[stored_name][0]
        dt = _SAFETENSORS_DTYPES.get(raw)
        return raw.lower() if dt is None else dt

    def stored_nbytes(self, stored_name: str) -> int:
        raw, shape = self._meta[stored_name]
        if raw not in _SAFETENSORS_DTYPES:
            raise CheckpointError(f"{self._where[stored_name]}: tensor {stored_name!r} has unsupported dtype {raw}")
        return _numel(shape) * _SAFETENSORS_BITS[raw] // 8

    def release(self, shard: Hashable) -> None:
        self._handles.pop(shard, None)  # type: ignore[call-overload]

    def _read(self, stored_name: str) -> Tensor:
        f = self._where[stored_name]
        try:
            h = self._handles.get(f)
            if h is None:
                h = self._handles[f] = _open_safetensors(f)
            return h.get_tensor(stored_name)  # type: ignore[attr-defined]
        except CheckpointError:
            raise
        except Exception as e:
            raise CheckpointError(f"{f}: cannot read tensor {stored_name!r} ({one_line(e)})") from None

    def close(self) -> None:
        self._handles.clear()


def read_safetensors_header(f: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Name -> (header dtype such as ``"BF16"``, shape) of every tensor in a .safetensors file, from its JSON header
    alone (json and struct: neither safetensors nor torch is imported). The header is checked as `safe_open` checks
    it (size, JSON object, known dtypes, offsets that tile the data exactly, sizes that match the shapes), so a
    corrupt or truncated file is refused here, naming the file.
    """
    try:
        with open(f, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(8)
            if len(head) < 8:
                raise _corrupt(f, f"{size} bytes, shorter than the header's length field")
            n = struct.unpack("<Q", head)[0]  # the JSON header's length, little-endian u64
            if n > _MAX_HEADER or 8 + n > size:
                raise _corrupt(f, f"header length {n} does not fit the file's {size} bytes")
            raw = fh.read(n)
    except FileNotFoundError:
        raise CheckpointError(f"{f}: file is missing") from None
    except OSError as e:
        raise CheckpointError(f"{f}: cannot read it ({os_reason(e)})") from None
    try:
        text = raw.decode("utf-8")
        header = json.loads(text) if text.startswith("{") else None
    except (ValueError, RecursionError):
        header = None
    if not isinstance(header, dict):
        raise _corrupt(f, "header is not a JSON object")
    return _checked_header(f, header, size - 8 - n)


def _checked_header(f: Path, header: dict[str, Any], data_size: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The tensors of a parsed header, after safetensors' own checks: the data offsets, sorted, tile the data
    section exactly and each tensor's byte size is its shape's element count times its dtype's size."""
    meta = header.pop("__metadata__", None)
    if meta is not None and not (isinstance(meta, dict) and all(type(v) is str for v in meta.values())):
        raise _corrupt(f, "__metadata__ is not an object of strings")
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    spans = []
    for name, info in header.items():
        dtype = info.get("dtype") if isinstance(info, dict) else None
        shape = info.get("shape") if isinstance(info, dict) else None
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (type(dtype) is str and dtype in _SAFETENSORS_BITS and _uints(shape) and _uints(offsets)
                and len(offsets) == 2):
            raise _corrupt(f, f"tensor {name!r}: no valid dtype, shape and data_offsets")
        spans.append((offsets[0], offsets[1], name, _bits(shape, _SAFETENSORS_BITS[dtype])))
        out[name] = (dtype, tuple(shape))
    end = 0
    for start, stop, name, bits in sorted(spans):
        if start != end or stop < start or bits is None or bits % 8 or stop - start != bits // 8:
            raise _corrupt(f, f"tensor {name!r}: data_offsets do not match its shape and dtype")
        end = stop
    if end != data_size:
        raise _corrupt(f, f"the data section holds {data_size} bytes, the header describes {end}")
    return out


def _bits(shape: list[int], bits: int) -> int | None:
    """Bits of a tensor's data, or None past 2**64 elements' worth (safetensors' own overflow check; it also keeps a
    hostile shape of a million huge sizes from costing a million bigint products)."""
    n = 1
    for s in shape:
        n *= s
        if n >= 1 << 64:
            return None
    return n * bits


def _uints(v: object) -> bool:
    """A JSON list of unsigned 64-bit integers (as the format's usize fields; not bools, not floats)."""
    return isinstance(v, list) and all(type(x) is int and 0 <= x < 1 << 64 for x in v)


def _corrupt(f: Path, why: str) -> CheckpointError:
    return CheckpointError(f"{f}: not a readable safetensors file, corrupt or truncated ({why})")


def _open_safetensors(f: Path):
    from safetensors import safe_open

    try:
        return safe_open(str(f), framework="pt")
    except FileNotFoundError:
        raise CheckpointError(f"{f}: file is missing") from None
    except (PermissionError, IsADirectoryError) as e:  # other OSErrors here come from the file's contents
        raise CheckpointError(f"{f}: cannot read it ({os_reason(e)})") from None
    except Exception as e:  # safetensors raises its own error types for corrupt or truncated files
        raise CheckpointError(f"{f}: not a readable safetensors file, corrupt or truncated ({one_line(e)})") from None


def shards_from_index(index: Path) -> list[Path]:
    """The shard files named by a ``*.index.json`` weight map, each checked to lie inside the index's folder (after
    links; refused before any shard is opened) and to exist."""
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index}: not a valid checkpoint index (weight_map is not an object of tensor names)")
    for tensor, name in weight_map.items():
        if type(name) is not str:
            raise CheckpointError(f"{index}: weight_map[{tensor!r}] is {name!r}, not a file name")
    files = [inside(index.parent, n, index, "shard") for n in sorted(set(weight_map.values()))]
    for f in files:
        if not f.is_file():
            raise CheckpointError(f"{index}: lists shard {f.name}, which is missing")
    return files


class DictSource(TensorSource):
    """In-memory tensors (tests, and checkpoints already loaded by other means).

    Example:
        >>> import torch
        >>> src = DictSource({"w": torch.zeros(2, 3)})
        >>> src.shape("w")
        (2, 3)
    """

    def __init__(self, tensors: dict[str, Tensor]):
        self.tensors = tensors

    def keys(self) -> list[str]:
        return list(self.tensors)

    def stored_shape(self, stored_name: str) -> tuple[int, ...]:
        return tuple(self.tensors[stored_name].shape)

    def stored_dtype(self, stored_name: str) -> str:
        return storage_dtype(self.tensors[stored_name].dtype)

    def stored_nbytes(self, stored_name: str) -> int:
        t = self.tensors[stored_name]
        return t.numel() * t.element_size()

    def _read(self, stored_name: str) -> Tensor:
        return self.tensors[stored_name]


def storage_dtype(t: Tensor | torch.dtype) -> str:
    """``torch.bfloat16`` (or a tensor of it) -> ``"bfloat16"``."""
    import torch  # already imported by whoever holds a tensor or a dtype

    dt = t.dtype if isinstance(t, torch.Tensor) else t
    return str(dt).removeprefix("torch.")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n




__all__ = ["TensorSource", "SafetensorsSource", "DictSource", "shards_from_index", "storage_dtype",
           "read_safetensors_header"]
