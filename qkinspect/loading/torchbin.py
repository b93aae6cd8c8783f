"""PyTorch ``.bin`` checkpoints, single or sharded (``pytorch_model.bin.index.json``).

Files are untrusted: they are read with ``torch.load(weights_only=True, mmap=True, map_location="cpu")``, which
refuses any pickle that would import or call code. Such a file is refused with a CheckpointError naming the global
it asks for; nothing in it runs.
"""

from __future__ import annotations

import re
import warnings
import zipfile
from collections.abc import Hashable, Iterable, Mapping
from pathlib import Path

import torch
from torch import Tensor

from qkinspect.errors import CheckpointError
from qkinspect.loading.checked import os_reason
from qkinspect.loading.source import ShardedSource, storage_dtype

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
        self._meta: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
        for f in self.files:
            for k, t in load_state_dict(f).items():
                self._where[k] = f
                self._meta[k] = (t.dtype, tuple(t.shape))

    def stored_dtype(self, stored_name: str) -> str:
        return storage_dtype(self._meta[stored_name][0])

    def stored_nbytes(self, stored_name: str) -> int:
        dtype, shape = self._meta[stored_name]
        return torch.Size(shape).numel() * dtype.itemsize

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
    return _tensors_of(f, obj)


def _load_error(f: Path, e: Exception) -> str:
    m = _GLOBAL.search(str(e))
    if m:
        return (f"{f}: refused: loading it would need pickle code ({m.group(1)}); only plain tensors are read "
                f"(torch.load weights_only=True). Convert it to safetensors with code you trust")
    detail = " ".join(str(e).split())[:160] or type(e).__name__
    return f"{f}: not a readable PyTorch checkpoint, corrupt or truncated ({detail})"


def _tensors_of(f: Path, obj: object) -> dict[str, Tensor]:
    """The tensors of a loaded object: a state dict, or a dict holding one under ``state_dict``."""
    if isinstance(obj, Mapping) and isinstance(obj.get("state_dict"), Mapping):
        obj = obj["state_dict"]
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{f}: holds a {type(obj).__name__}, not a state dict of named tensors")
    out = {str(k): v for k, v in obj.items() if isinstance(v, Tensor)}
    if not out:
        raise CheckpointError(f"{f}: holds no tensors")
    return out


__all__ = ["TorchBinSource", "load_state_dict"]
