"""Tensor sources: read named tensors one at a time from a checkpoint, never the whole file."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from qkinspect.errors import CheckpointError


class TensorSource:
    """Named tensors of a checkpoint. Names may carry a base-model prefix (``bert.``, ``model.``);
    `resolve` maps an adapter's unprefixed name to the stored one."""

    def keys(self) -> list[str]:
        raise NotImplementedError

    def _read(self, stored_name: str) -> Tensor:
        raise NotImplementedError

    def stored_shape(self, stored_name: str) -> tuple[int, ...]:
        raise NotImplementedError

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


class SafetensorsSource(TensorSource):
    """One or more .safetensors files (a sharded checkpoint lists them in model.safetensors.index.json)."""

    def __init__(self, files: list[Path]):
        from safetensors import safe_open

        self.files = files
        self._handles = {}
        self._where: dict[str, Path] = {}
        for f in files:
            try:
                h = safe_open(str(f), framework="pt")
            except Exception as e:  # safetensors raises its own error types for corrupt headers
                raise CheckpointError(f"{f}: not a readable safetensors file ({e})") from None
            self._handles[f] = h
            for k in h.keys():
                self._where[k] = f

    @classmethod
    def from_index(cls, index: Path) -> SafetensorsSource:
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise CheckpointError(f"{index}: not a valid safetensors index ({e})") from None
        files = sorted({index.parent / f for f in weight_map.values()})
        return cls(files)

    def keys(self) -> list[str]:
        return list(self._where)

    def stored_shape(self, stored_name: str) -> tuple[int, ...]:
        h = self._handles[self._where[stored_name]]
        return tuple(h.get_slice(stored_name).get_shape())

    def _read(self, stored_name: str) -> Tensor:
        f = self._where[stored_name]
        try:
            return self._handles[f].get_tensor(stored_name)
        except Exception as e:
            raise CheckpointError(f"{f}: cannot read tensor {stored_name!r} ({e})") from None

    def close(self) -> None:
        self._handles.clear()


class DictSource(TensorSource):
    """In-memory tensors (tests, and checkpoints already loaded by other means)."""

    def __init__(self, tensors: dict[str, Tensor]):
        self.tensors = tensors

    def keys(self) -> list[str]:
        return list(self.tensors)

    def stored_shape(self, stored_name: str) -> tuple[int, ...]:
        return tuple(self.tensors[stored_name].shape)

    def _read(self, stored_name: str) -> Tensor:
        return self.tensors[stored_name]


def storage_dtype(t: Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


__all__ = ["TensorSource", "SafetensorsSource", "DictSource", "storage_dtype", "torch"]
