"""model_type -> adapter class, with an entry-point group for third-party adapters."""

from __future__ import annotations

import pkgutil
from importlib import import_module
from importlib.metadata import entry_points

from qkinspect.errors import UnsupportedModelError
from qkinspect.loading.adapters.base import Adapter

ENTRY_POINT_GROUP = "qkinspect.adapters"

# Every module in this package except these defines built-in adapters (imported lazily, once).
_NOT_ADAPTERS = {"base", "registry"}

_REGISTRY: dict[str, type[Adapter]] = {}
_loaded = False


def register(cls: type[Adapter]) -> type[Adapter]:
    """Class decorator: make `cls` the adapter for each of its `model_types`."""
    for mt in cls.model_types:
        _REGISTRY[mt] = cls
    return cls


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    from qkinspect.loading import adapters

    for mod in sorted(m.name for m in pkgutil.iter_modules(adapters.__path__)):
        if mod not in _NOT_ADAPTERS:
            import_module(f"qkinspect.loading.adapters.{mod}")
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        obj = ep.load()
        if isinstance(obj, type) and issubclass(obj, Adapter):
            register(obj)


def supported_model_types() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def adapter_for(model_type: str) -> type[Adapter]:
    _load_all()
    try:
        return _REGISTRY[model_type]
    except KeyError:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported; supported: {', '.join(supported_model_types())}"
        ) from None
