"""PyTorch ``.bin`` checkpoints, single or sharded (``pytorch_model.bin.index.json``).

Files are untrusted: tensors are read with ``torch.load(weights_only=True, mmap=True, map_location="cpu")``, which
refuses any pickle that would import or call code. Such a file is refused with a CheckpointError naming the global
it asks for; nothing in it runs.

Opening a file (`qkinspect info`) needs only names, shapes and dtypes: `read_bin_header` reads them from the zip
archive's ``data.pkl`` without torch, with an unpickler that knows a plain state dict's few globals (an
OrderedDict, torch's tensor and parameter rebuild functions, storage types and dtypes) and stands its own inert
records in for them: nothing the file names is imported or called. Any file it does not fully understand (an older
non-zip file, another global, a big-endian file, anything odd) is left to ``torch.load`` as before.
"""

from __future__ import annotations

import collections
import pickle
import re
import warnings
import zipfile
from collections.abc import Hashable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qkinspect.errors import CheckpointError
from qkinspect.loading.source import ShardedSource, storage_dtype
from qkinspect.reading import os_reason

if TYPE_CHECKING:
    from torch import Tensor

_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


class TorchBinSource(ShardedSource):
    """Tensors of one or more ``torch.save`` state-dict files.

    Every file is opened once up front (memory-mapped, so only the pickled metadata is read) to learn names,
    shapes and dtypes and to refuse unreadable or unsafe files early; it is mapped again when a tensor in it is
    first read, and unmapped on `release`. Tensors are copied out of the mapping, so releasing it frees the file.

    Example:
        >>> src = TorchBinSource([Path("pytorch_model.bin")])  # doctest: +SKIP
        >>> src.get("encoder.layer.0.attention.self.query.weight").shape  # doctest: +SKIP
        torch.Size([512, 512])
    """

    def __init__(self, files: Iterable[Path]):
        self.files = [Path(f) for f in files]
        self._loaded: dict[Path, Mapping[str, Tensor]] = {}
        self._where: dict[str, Path] = {}
        self._meta: dict[str, tuple[str, tuple[int, ...]]] = {}  # name -> (dtype name, shape)
        for f in self.files:
            header = read_bin_header(f)
            if header is None:  # not a file the light reader understands: torch decides
                header = {k: (storage_dtype(t), tuple(t.shape)) for k, t in load_state_dict(f).items()}
            for k, meta in header.items():
                self._where[k] = f
                self._meta[k] = meta

    def stored_dtype(self, stored_name: str) -> str:
        return self._meta[stored_name][0]

    def stored_nbytes(self, stored_name: str) -> int:
        dtype, shape = self._meta[stored_name]
        n = _ITEMSIZE[dtype]
        for s in shape:
            n *= s
        return n

    def release(self, shard: Hashable) -> None:
        self._loaded.pop(shard, None)  # type: ignore[call-overload]

    def _read(self, stored_name: str) -> Tensor:
        f = self._where[stored_name]
        sd = self._loaded.get(f)
        if sd is None:
            sd = self._loaded[f] = load_state_dict(f)
        return sd[stored_name].clone()  # a copy: the layer must not pin the file mapping

    def close(self) -> None:
        self._loaded.clear()


def load_state_dict(f: Path) -> dict[str, Tensor]:
    """Load a state dict safely (weights only, memory-mapped where the file allows), or raise CheckpointError."""
    import torch

    # Files written by torch >= 1.6 are zip archives and can be memory-mapped; older ones are read whole.
    try:
        mmap = zipfile.is_zipfile(f)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obj = torch.load(f, weights_only=True, mmap=mmap, map_location="cpu")
    except FileNotFoundError:
        raise CheckpointError(f"{f}: file is missing") from None
    except (PermissionError, IsADirectoryError) as e:  # other OSErrors here come from the file's contents
        raise CheckpointError(f"{f}: cannot read it ({os_reason(e)})") from None
    except Exception as e:
        raise CheckpointError(_load_error(f, e)) from None
    return _tensors_of(f, obj, torch.Tensor)


def _load_error(f: Path, e: Exception) -> str:
    m = _GLOBAL.search(str(e))
    if m:
        return (f"{f}: refused: loading it would need pickle code ({m.group(1)}); only plain tensors are read "
                f"(torch.load weights_only=True). Convert it to safetensors with code you trust")
    detail = " ".join(str(e).split())[:160] or type(e).__name__
    return f"{f}: not a readable PyTorch checkpoint, corrupt or truncated ({detail})"


def _tensors_of(f: Path, obj: object, tensor_type: type) -> dict[str, Any]:
    """The tensors (`tensor_type`: torch's, or the light reader's records) of a loaded object: a state dict, or a
    dict holding one under ``state_dict``."""
    if isinstance(obj, Mapping) and isinstance(obj.get("state_dict"), Mapping):
        obj = obj["state_dict"]
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{f}: holds a {type(obj).__name__}, not a state dict of named tensors")
    out = {str(k): v for k, v in obj.items() if isinstance(v, tensor_type)}
    if not out:
        raise CheckpointError(f"{f}: holds no tensors")
    return out


# -- names, shapes and dtypes without torch ------------------------------------------------------------------------

# torch's storage classes and dtypes, by the names a pickle gives them -> dtype name; bytes per element.
_STORAGES = {"DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16",
             "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16",
             "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool",
             "ComplexFloatStorage": "complex64", "ComplexDoubleStorage": "complex128"}
_ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
             "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16}
_MAX_PICKLE = 256 << 20  # a state dict's pickle is kilobytes to a few MiB; anything larger goes to torch.load


class _NotPlain(Exception):
    """The file is not a plain zip state dict this reader understands: leave it to torch.load."""


class _Inert:
    """A stand-in the pickle cannot change: no attribute dict, and BUILD (``__setstate__``) is refused."""

    __slots__ = ()

    def __setstate__(self, state: object) -> None:
        raise _NotPlain("state set on a stand-in")


class _StorageType(_Inert):
    __slots__ = ("dtype",)

    def __init__(self, dtype: str | None):  # None: an UntypedStorage (bytes; the tensor names its dtype)
        self.dtype = dtype


class _DType(_Inert):
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


class _Storage(_Inert):
    __slots__ = ("dtype", "key", "nbytes")

    def __init__(self, dtype: str | None, key: str, nbytes: int):
        self.dtype, self.key, self.nbytes = dtype, key, nbytes


class _TensorMeta(_Inert):
    """What torch would rebuild, as a record: dtype name and shape."""

    __slots__ = ("dtype", "shape")

    def __init__(self, dtype: str, shape: tuple[int, ...]):
        self.dtype, self.shape = dtype, shape


def _count(x: object) -> bool:
    """A size, stride, offset or element count as torch stores them (int64; no huge pickled longs to multiply)."""
    return type(x) is int and 0 <= x < 1 << 63


def _ints(v: object) -> tuple[int, ...]:
    if not (isinstance(v, tuple) and all(_count(x) for x in v)):
        raise _NotPlain("not a tuple of sizes")
    return v


def _tensor(storage: object, offset: object, size: object, stride: object, dtype: str | None) -> _TensorMeta:
    """A tensor's record, after the bounds check torch makes when it sets a tensor on its storage."""
    if not isinstance(storage, _Storage) or not _count(offset) or dtype not in _ITEMSIZE:
        raise _NotPlain("not a plain tensor")
    size, stride = _ints(size), _ints(stride)
    if len(size) != len(stride):
        raise _NotPlain("sizes and strides differ in length")
    extent = 0 if 0 in size else offset + 1 + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    if extent * _ITEMSIZE[dtype] > storage.nbytes:
        raise _NotPlain("tensor past its storage")
    return _TensorMeta(dtype, size)


def _rebuild_tensor_v2(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
    return _tensor(storage, offset, size, stride, getattr(storage, "dtype", None))


def _rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype, metadata=None):
    if not isinstance(dtype, _DType) or getattr(storage, "dtype", "") is not None:
        raise _NotPlain("not a plain tensor")
    return _tensor(storage, offset, size, stride, dtype.name)


def _rebuild_parameter(data, requires_grad, hooks, state=None):
    if not isinstance(data, _TensorMeta):
        raise _NotPlain("a parameter that is not a plain tensor")
    return data


_REBUILD = {"_rebuild_tensor_v2": _rebuild_tensor_v2, "_rebuild_tensor_v3": _rebuild_tensor_v3,
            "_rebuild_parameter": _rebuild_parameter, "_rebuild_parameter_with_state": _rebuild_parameter}


class _HeaderUnpickler(pickle.Unpickler):
    """Builds only dicts, lists, tuples, numbers, strings and the inert records above: `find_class` answers every
    global the pickle names with a stand-in of ours (or refuses it), so nothing the file names is imported."""

    def __init__(self, data: bytes, records: dict[str, int]):
        import io

        super().__init__(io.BytesIO(data))
        self.records = records  # storage key -> bytes of its data record in the archive

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch._utils" and name in _REBUILD:
            return _REBUILD[name]
        if module == "torch" and name in _STORAGES:
            return _StorageType(_STORAGES[name])
        if (module, name) == ("torch.storage", "UntypedStorage"):
            return _StorageType(None)
        if module == "torch" and name in _ITEMSIZE:
            return _DType(name)
        raise _NotPlain(f"GLOBAL {module}.{name}")

    def persistent_load(self, pid: Any) -> _Storage:
        # ("storage", storage type, key, location, number of elements (bytes for an UntypedStorage))
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType) and type(pid[2]) is str and _count(pid[4])):
            raise _NotPlain("not a storage reference")
        dtype, key, numel = pid[1].dtype, pid[2], pid[4]
        nbytes = numel * (1 if dtype is None else _ITEMSIZE[dtype])
        if self.records.get(key, -1) < nbytes:
            raise _NotPlain(f"storage {key!r} is missing or short")
        return _Storage(dtype, key, nbytes)


def read_bin_header(f: Path) -> dict[str, tuple[str, tuple[int, ...]]] | None:
    """Name -> (dtype name, shape) of the tensors in a ``torch.save`` zip archive, read from its pickle without
    importing torch or running anything the file names; None when the file is not one this reader fully
    understands (then ``torch.load`` decides, as it did before). Errors the file's layout leaves no doubt about
    (not a state dict, no tensors) are raised as CheckpointError."""
    try:
        with zipfile.ZipFile(f) as z:
            infos = z.infolist()
            pickles = [i for i in infos if i.filename.count("/") == 1 and i.filename.endswith("/data.pkl")]
            if len(pickles) != 1:
                return None
            prefix = pickles[0].filename.removesuffix("data.pkl")
            names = {i.filename for i in infos}
            order = f"{prefix}byteorder"
            if order in names and z.read(order) != b"little":
                return None
            if pickles[0].compress_type != zipfile.ZIP_STORED or pickles[0].file_size > _MAX_PICKLE:
                return None
            records = {i.filename.removeprefix(f"{prefix}data/"): i.file_size for i in infos
                       if i.filename.startswith(f"{prefix}data/") and i.compress_type == zipfile.ZIP_STORED}
            obj = _HeaderUnpickler(z.read(pickles[0]), records).load()
    except Exception:  # not a zip, corrupt, another global, odd data ...: torch.load's own messages say which
        return None
    if not isinstance(obj, Mapping):  # torch.load names what it holds
        return None
    tensors = _tensors_of(f, obj, _TensorMeta)
    return {k: (t.dtype, t.shape) for k, t in tensors.items()}


__all__ = ["TorchBinSource", "load_state_dict", "read_bin_header"]
