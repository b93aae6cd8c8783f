"""Casting tensors as they are read, into destination buffers that a stream of layers reuses.

A 7B layer's query, key and value weights are 64 MB each in float32. Allocating them fresh for every layer costs
page faults on first write and unmapping on release: on two cores that was a third of the time per layer, more than
the cast itself. A `Caster` made with `recycle=True` keeps the buffers it handed out and writes a later tensor of the
same shape and dtype into one of them, but only once nothing else holds it: the buffer's storage reference count
says whether any tensor, view or numpy array outside the caster still uses it. Where torch does not expose that
count, nothing is reused.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

_KEEP = 32  # buffers remembered per caster (a few layers' worth); older ones are left to their holders


class Caster:
    """Casts floating tensors to `dtype` (always a copy, so no result keeps a file mapping alive); other tensors,
    placeholders on the meta device, and everything when `dtype` is None pass through. Floating tensors stored in
    one of the `keep` dtypes are copied as they are, uncast (for products that read bf16 directly).

    Example:
        >>> cast = Caster(torch.float32, recycle=True)
        >>> a = cast(torch.ones(2, 3, dtype=torch.bfloat16))
        >>> b = cast(torch.zeros(2, 3, dtype=torch.bfloat16))  # `a` is still held: a new buffer
        >>> a.sum().item(), b.sum().item()
        (6.0, 0.0)
    """

    def __init__(self, dtype: torch.dtype | None, recycle: bool = False, keep: Iterable[torch.dtype] = ()):
        self.dtype = dtype
        self.keep = frozenset(keep)
        self.recycle = recycle and _reference_count_works()
        self._buffers: list[Tensor] = []

    def __call__(self, t: Tensor) -> Tensor:
        if self.dtype is None or t.is_meta or not t.is_floating_point():
            return t
        dtype = t.dtype if t.dtype in self.keep else self.dtype
        if not self.recycle:
            return t.to(dtype, copy=True)
        # A view, not the kept tensor itself: the storage count covers tensors, not Python references, so the
        # caller must hold its own tensor for the count to see it.
        return self._buffer(t.shape, t.device, dtype).copy_(t).view(t.shape)

    def _buffer(self, shape: torch.Size, device: torch.device, dtype: torch.dtype) -> Tensor:
        for b in self._buffers:
            if b.shape == shape and b.device == device and b.dtype == dtype and _unshared(b):
                return b
        b = torch.empty(shape, dtype=dtype, device=device)
        self._buffers.append(b)
        del self._buffers[:-_KEEP]
        return b


def _use_count(t: Tensor) -> int:
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


_ALONE: int | None = None


def _unshared(t: Tensor) -> bool:
    """No tensor, view or array but the caster's own reference uses `t`'s storage."""
    return _use_count(t) == _ALONE


def _reference_count_works() -> bool:
    """Calibrate once: the count of a tensor held only here, and that a view and an array each raise it."""
    global _ALONE
    if _ALONE is not None:
        return _ALONE > 0
    _ALONE = 0
    try:
        t = torch.empty(4)
        alone = _use_count(t)
        view = t[1:]
        with_view = _use_count(t)
        del view
        arr = t.numpy()
        with_array = _use_count(t)
        del arr
        if with_view > alone and with_array > alone and _use_count(t) == alone:
            _ALONE = alone
    except (AttributeError, RuntimeError, TypeError):  # a torch without the private counter: never reuse
        pass
    return _ALONE > 0
