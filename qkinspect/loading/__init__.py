"""Open checkpoints and yield canonical AttentionLayers (DESIGN.md §2)."""

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

    Example:
        >>> with open_model("path/to/bert") as m:
        ...     for layer in m.layers():
        ...         print(layer.block, layer.layer, layer.W_Q.shape)
    """
    r = resolve(spec, revision=revision)
    return LoadedModel(r, adapter_for(r.config.model_type)(r.config))


def load(spec: str | Path | None = None, **kwargs) -> Iterator[AttentionLayer]:
    """Yield every AttentionLayer of a model, one layer in memory at a time."""
    with open_model(spec, **kwargs) as m:
        yield from m.layers()


__all__ = ["open_model", "load", "LoadedModel", "supported_model_types", "adapter_for"]
