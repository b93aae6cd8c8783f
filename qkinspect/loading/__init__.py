"""Open checkpoints and yield canonical AttentionLayers (DESIGN.md §2). See docs/loading.md."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from qkinspect.layer import AttentionLayer
from qkinspect.loading.adapters.registry import adapter_for, supported_model_types
from qkinspect.loading.model import LoadedModel
from qkinspect.loading.resolve import resolve


def open_model(
    spec: str | Path | None = None, *, revision: str | None = None, trust_remote_code: bool = False
) -> LoadedModel:
    """Open a checkpoint without reading its weights. `spec` None means the bundled demo model.

    `spec` is a folder with config.json, a .safetensors/.bin file beside one, a .gguf file, or a hub id
    ``org/name`` (with `revision`). Remote code is never run: `trust_remote_code=True` is refused.

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
    r = resolve(spec, revision=revision)
    try:
        return LoadedModel(r, adapter_for(r.config.model_type)(r.config))
    except BaseException:
        r.source.close()
        raise


def load(spec: str | Path | None = None, *, prefetch: bool = False, **kwargs) -> Iterator[AttentionLayer]:
    """Yield every AttentionLayer of a model, one layer in memory at a time (two with `prefetch`).

    Example:
        >>> for layer in load("path/to/bert"):  # doctest: +SKIP
        ...     print(layer.layer, layer.W_K.shape)
    """
    with open_model(spec, **kwargs) as m:
        yield from m.layers(prefetch=prefetch)


__all__ = ["open_model", "load", "LoadedModel", "supported_model_types", "adapter_for"]
