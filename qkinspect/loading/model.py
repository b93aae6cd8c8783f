"""An opened checkpoint: its identity, and its attention layers read one at a time.

Opening checks every required attention tensor against the config (presence and shape, from the file headers), so a
bad checkpoint fails before any layer is read. Iterating `layers()` reads one layer's tensors, builds its
AttentionLayer, and releases each shard as soon as no later layer needs it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields, replace
from typing import TYPE_CHECKING

from qkinspect.errors import CheckpointError, QkinspectError, one_line
from qkinspect.layer import AttentionLayer, ModelInfo
from qkinspect.loading.adapters.base import Adapter
from qkinspect.loading.resolve import Resolved
from qkinspect.loading.source import storage_dtype

if TYPE_CHECKING:  # torch is imported when a layer is read, not when a model is opened (`qkinspect info`)
    import torch
    from torch import Tensor

    from qkinspect.loading.cast import Caster

Step = tuple[str, int]  # (block, layer)


class LoadedModel:
    """Use as a context manager; `layers()` yields AttentionLayers, reading only one layer's tensors at a time.

    Example:
        >>> from qkinspect.loading import open_model
        >>> with open_model("path/to/bert") as m:  # doctest: +SKIP
        ...     print(m.info.dtype, m.info.attention_bytes)
        ...     for layer in m.layers(prefetch=True):  # reads layer i+1 while you work on layer i
        ...         print(layer.block, layer.layer, layer.W_Q.shape)
    """

    def __init__(self, resolved: Resolved, adapter: Adapter):
        self.resolved = resolved
        self.adapter = adapter
        self.source = resolved.source
        self._lock = threading.Lock()  # one reader at a time (the prefetch thread or the caller)
        blocks = tuple(adapter.blocks())
        self.info = ModelInfo(
            name=resolved.name,
            source=resolved.origin or str(resolved.path),
            model_type=resolved.config.model_type,
            format=resolved.format,  # type: ignore[arg-type]
            blocks=blocks,
            revision=resolved.revision,
            architecture=resolved.architecture or (getattr(resolved.config, "architectures", None) or [None])[0],
            quantization=getattr(resolved.source, "quantization", None),
        )
        dtype, nbytes = self._check_all()
        self.info = replace(self.info, dtype=dtype, attention_bytes=nbytes)

    def __enter__(self) -> LoadedModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.source.close()

    def plan(self, blocks: Iterable[str] | None = None, layers: Iterable[int] | None = None) -> Iterator[Step]:
        """(block, layer) pairs to read, in file order."""
        want_blocks = set(blocks) if blocks is not None else None
        want_layers = set(layers) if layers is not None else None
        for b in self.info.blocks:
            if want_blocks is not None and b.key not in want_blocks:
                continue
            for i in range(b.n_layers):
                if want_layers is None or i in want_layers:
                    yield b.key, i

    # -- checking and sizing, from headers only ------------------------------------------------------

    def _check_all(self) -> tuple[str | None, int]:
        """Check every required tensor's presence and shape; (storage dtype(s), bytes) of the attention weights.

        Tensors shared by several layers (ALBERT) are counted once.
        """
        stored: dict[str, None] = {}
        for block, i in self.plan():
            shapes = self.adapter.expected_shapes(block, i)
            for name in self.adapter.tensor_names(block, i):
                s = self._stored_name(name, block, i)
                self._check_shape(name, self.source.stored_shape(s), shapes.get(name))
                stored[s] = None
        dtypes = sorted({self.source.stored_dtype(s) for s in stored})
        return ("+".join(dtypes) or None), sum(self.source.stored_nbytes(s) for s in stored)

    def _stored_name(self, name: str, block: str, layer: int) -> str:
        s = self.source.resolve(name)
        if s is None:
            raise self._missing(name, block, layer)
        return s

    def _missing(self, name: str, block: str, layer: int) -> CheckpointError:
        return CheckpointError(f"{self.info.source}: tensor {name!r} is missing ({block} layer {layer})")

    def _check_shape(self, name: str, shape: tuple[int, ...], want: tuple[int, ...] | None) -> None:
        if want is not None and tuple(shape) != tuple(want):
            raise CheckpointError(
                f"{self.info.source}: tensor {name!r} has shape {tuple(shape)}, but the config implies {tuple(want)}"
            )

    # -- reading ---------------------------------------------------------------------------------------

    def read_tensors(self, block: str, layer: int, *, need_o: bool = True,
                     dtype: torch.dtype | None = None) -> dict[str, Tensor]:
        """Read and shape-check one layer's tensors (required and optional).

        `need_o=False`: the tensors the adapter names as feeding only W_O / b_O are not read; a shape-only
        placeholder (on the meta device) stands in for each. `dtype`: floating tensors are cast to it as they are
        read (always a copy, so no returned tensor keeps the file's mapping alive).
        """
        from qkinspect.loading.cast import Caster

        return self._read_tensors(block, layer, need_o, Caster(dtype))

    def _read_tensors(self, block: str, layer: int, need_o: bool, cast: Caster) -> dict[str, Tensor]:
        a = self.adapter
        skip = set() if need_o else set(a.output_names(block, layer))
        out: dict[str, Tensor] = {}
        shapes = a.expected_shapes(block, layer)
        for name in a.tensor_names(block, layer):
            t = self._placeholder(name) if name in skip else self.source.get(name)
            if t is None:
                raise self._missing(name, block, layer)
            self._check_shape(name, tuple(t.shape), shapes.get(name))
            out[name] = cast(self._floating(name, t))
        for name in a.optional_names(block, layer):
            t = self._placeholder(name) if name in skip else self.source.get(name)
            if t is not None:  # biases and norms: checked like the weights, where they enter
                self._check_shape(name, tuple(t.shape), shapes.get(name))
                out[name] = cast(self._floating(name, t))
        return out

    def _floating(self, name: str, t: Tensor) -> Tensor:
        """Refuse integer (or bool) weights: without a quantization the source dequantizes, their values are not
        the model's weights."""
        if not t.is_floating_point():
            raise CheckpointError(f"{self.info.source}: tensor {name!r} is stored as {storage_dtype(t)}, not a "
                                  f"floating-point type; integer weights without a known quantization are refused")
        return t

    def _placeholder(self, name: str) -> Tensor | None:
        """A tensor of the stored shape with no data (meta device), or None when the checkpoint lacks `name`."""
        import torch

        stored = self.source.resolve(name)
        return None if stored is None else torch.empty(self.source.stored_shape(stored), device="meta")

    def layer(self, block: str, layer: int, *, need_o: bool = True, dtype: torch.dtype | None = None
              ) -> AttentionLayer:
        """Read and build one layer (random access; reopens a released shard if needed).

        `need_o=False` gives W_O = b_O = None (and does not read them where the adapter names them); `dtype`
        casts the floating tensors as they are read (see `read_tensors`).
        """
        from qkinspect.loading.cast import Caster

        return self._layer(block, layer, need_o, Caster(dtype))

    def _layer(self, block: str, layer: int, need_o: bool, cast: Caster) -> AttentionLayer:
        with self._lock:
            tensors = self._read_tensors(block, layer, need_o, cast)
        built = self._build(block, layer, tensors)
        if cast.keep and _computed_in(built, cast.keep, tensors.values()):
            # The adapter did arithmetic on uncast half-precision tensors (composed or scaled weights): that would
            # round, so build this layer again from the tensors cast as usual (exact: a cast of stored values).
            from qkinspect.loading.cast import Caster

            built = self._build(block, layer, {k: Caster(cast.dtype)(t) for k, t in tensors.items()})
        return built if need_o else replace(built, W_O=None, b_O=None)

    def _build(self, block: str, layer: int, tensors: dict[str, Tensor]) -> AttentionLayer:
        try:
            return self.adapter.build(block, layer, tensors)
        except CheckpointError as e:  # an adapter's own check: said with the file, once
            if str(e).startswith(str(self.info.source)):
                raise
            raise CheckpointError(f"{self.info.source}: {block} layer {layer}: {e}") from None
        except QkinspectError:
            raise
        except (ValueError, AssertionError, RuntimeError, IndexError) as e:  # shapes inside the adapter (a
            # reshape torch refuses) or AttentionLayer's own checks: the checkpoint disagrees with itself
            raise CheckpointError(f"{self.info.source}: {block} layer {layer}: {one_line(e)}") from None

    def layers(
        self, blocks: Iterable[str] | None = None, layers: Iterable[int] | None = None, *, prefetch: bool = False,
        need_o: bool = True, dtype: torch.dtype | None = None, keep: Iterable[torch.dtype] = (),
    ) -> Iterator[AttentionLayer]:
        """Yield the chosen layers in file order. With `prefetch`, a background thread reads layer i+1 while the
        caller works on layer i (two layers in memory instead of one); its errors are raised here.

        `need_o=False` skips W_O; `dtype` casts as the tensors are read (in the prefetch thread with `prefetch`,
        so the cast overlaps the caller's work), and then each shard's mapping is released right after the layer
        is read: the cast copies hold no pages of the file, and a later layer reopens the shard (a header read).
        Cast layers are written into buffers reused from earlier layers that nothing holds any more (see
        `qkinspect.loading.cast`): drop a layer (and its views) when done with it to let its memory be reused.
        Tensors stored in a `keep` dtype (bf16, for the bf16 product route) are copied uncast; a layer whose
        adapter computes with them (rather than reshaping them) is built from the cast tensors instead.
        """
        from qkinspect.loading.cast import Caster

        steps = list(self.plan(blocks, layers))
        release = self._release_plan(steps, every_step=dtype is not None)
        cast = Caster(dtype, recycle=True, keep=keep)  # used by one reading thread at a time

        def read(k: int) -> AttentionLayer:
            layer = self._layer(*steps[k], need_o, cast)
            with self._lock:
                for shard in release[k]:
                    self.source.release(shard)
            return layer

        if prefetch:
            yield from _prefetched(read, len(steps))
        else:
            for k in range(len(steps)):
                yield read(k)

    def _release_plan(self, steps: list[Step], every_step: bool = False) -> list[list[Hashable]]:
        """For each step, the shards to release right after it: those no later step reads, or (`every_step`)
        every shard the step read."""
        last: dict[Hashable, int] = {}
        out: list[list[Hashable]] = [[] for _ in steps]
        for k, (block, i) in enumerate(steps):
            for name in self.adapter.tensor_names(block, i) + self.adapter.optional_names(block, i):
                stored = self.source.resolve(name)
                shard = None if stored is None else self.source.shard_of(stored)
                if shard is not None:
                    last[shard] = k
                    if every_step and shard not in out[k]:
                        out[k].append(shard)
        if not every_step:
            for shard, k in last.items():
                out[k].append(shard)
        return out


def _prefetched(read: Callable[[int], AttentionLayer], n: int) -> Iterator[AttentionLayer]:
    """Yield read(0..n-1), reading item k+1 in a worker thread while the caller holds item k."""
    if n == 0:
        return
    reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="qkinspect-prefetch", initializer=_one_torch_thread)
    with reader as pool:
        pending = pool.submit(read, 0)
        try:
            for k in range(n):
                layer = pending.result()  # re-raises the worker's exception in the caller
                pending = pool.submit(read, k + 1) if k + 1 < n else None
                yield layer
                del layer
        finally:
            if pending is not None:
                pending.cancel()  # the caller stopped early; the executor waits for a read already running


def _one_torch_thread() -> None:
    """The reading thread casts on one thread of its own: the caller's threads are busy with the products, and a
    team of threads for the cast would take turns with them."""
    import torch

    torch.get_num_threads()  # initialise this thread's count first, or its first parallel op resets it
    torch.set_num_threads(1)


def _computed_in(layer: AttentionLayer, dtypes: frozenset[torch.dtype], read: Iterable[Tensor]) -> bool:
    """Whether any tensor of `layer` in one of `dtypes` is not a view of a tensor that was read (then the adapter
    computed it in that dtype)."""
    from torch import Tensor

    storages = {t.untyped_storage().data_ptr() for t in read if not t.is_meta}
    tensors = [getattr(layer, f.name) for f in fields(layer)]
    tensors += [t for norm in (layer.norm_q, layer.norm_kv) if norm is not None for t in (norm.weight, norm.bias)]
    return any(isinstance(t, Tensor) and t.dtype in dtypes and not t.is_meta
               and t.untyped_storage().data_ptr() not in storages for t in tensors)
