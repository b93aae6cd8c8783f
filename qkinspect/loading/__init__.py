"""Open checkpoints and yield canonical AttentionLayers (ARCHITECTURE.md §2). See docs/loading.md."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from qkinspect.layer import AttentionLayer
from qkinspect.loading.adapters.registry import adapter_for, supported_model_types
from qkinspect.loading.model import LoadedModel
from qkinspect.loading.resolve import resolve


def open_model(
    spec: str | Path | Any = None, *, revision: str | None = None, trust_remote_code: bool = False
) -> LoadedModel:
    """Open a checkpoint without reading its weights. `spec` None means the bundled demo model.

    `spec` is a folder with config.json, a .safetensors/.bin file beside one, a .gguf file, or a hub id
    ``org/name`` (with `revision`); or a model in memory: a transformers PreTrainedModel, or a (config, state_dict)
    pair, read in place (qkinspect.loading.in_memory). Remote code is never run: `trust_remote_code=True` is
    refused.

    Raises:
        ModelNotFoundError, UnsupportedModelError, CheckpointError (all InputError, exit code 2).

    Example:
        >>> with open_model("path/to/bert") as m:  # doctest: +SKIP
        ...     for layer in m.layers():
        ...         print(layer.block, layer.layer, layer.W_Q.shape)
    """
    if trust_remote_code:
        from qkinspect.errors import InputError

        raise InputError("trust_remote_code is not supported: checkpoints are untrusted and no model code is run")
    from qkinspect.loading.in_memory import is_in_memory, resolve_memory

    r = resolve_memory(spec) if is_in_memory(spec) else resolve(spec, revision=revision)
    try:
        return LoadedModel(r, adapter_for(r.config.model_type)(r.config))
    except BaseException:
        r.source.close()
        raise


@contextlib.contextmanager
def opened(model: Any, revision: str | None = None) -> Iterator[LoadedModel]:
    """Yield `model` opened (anything open_model takes), or as it is when it is already a LoadedModel; close it
    afterwards only if it was opened here. The one way the library's procedures take "a model or an opened one"."""
    if isinstance(model, LoadedModel):
        yield model
        return
    with open_model(model, revision=revision) as m:  # a model object in memory is checked there
        yield m


def load(spec: str | Path | Any = None, *, layers: str | int | Iterable[int] | None = None,
         blocks: str | Iterable[str] | None = None, prefetch: bool = False, **kwargs) -> Iterator[AttentionLayer]:
    """Yield the AttentionLayers of a model, one layer in memory at a time (two with `prefetch`).

    Args:
        spec: a path, hub id or GGUF file; None for the demo model; a transformers model or a (config, state_dict)
            pair in memory (its layers are then views of the model's own tensors, on its device).
        layers: layer indexes as the CLI takes them ("0-3,7") or as Python values (3, [0, 1]); None for all.
        blocks: block kinds or labels ("encoder", ["decoder", "cross"]); None for all.
        kwargs: passed to `open_model` (e.g. revision).

    Raises:
        InputError: a layer or block the model does not have, named as `layers=` / `blocks=`.

    Example:
        >>> for layer in load("path/to/bert", layers="0-1"):  # doctest: +SKIP
        ...     print(layer.layer, layer.W_K.shape)
    """
    from qkinspect.selection import as_indexes, check_selection

    with open_model(spec, **kwargs) as m:
        wanted = as_indexes(layers, "layers")
        chosen = check_selection(m.info, blocks, wanted)
        yield from m.layers([b.key for b in chosen], wanted, prefetch=prefetch)


__all__ = ["open_model", "load", "LoadedModel", "supported_model_types", "adapter_for"]
