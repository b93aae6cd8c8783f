"""How heads compose across layers (Q-, K- and V-composition), from the weights (docs/composition.md).

Rooms: `run` (`composition`: the scores, layer by layer, in bounded memory), `streams` (which heads compose into
which: the residual streams of each block pair), `results` (`CompositionResult`, its records), `saved`
(`read_composition`, the checked reader of a saved document). Its table for people is
`qkinspect.terminal.composition`, its figure `qkinspect.report.composition`.

    qkinspect.composition(model, ...) -> CompositionResult    (the package is callable)
"""

from __future__ import annotations

import importlib
import sys
import types

_NAMES = {"composition": "run", "CompositionResult": "results", "CompositionRecord": "results",
          "read_composition": "saved", "is_composition_document": "saved"}


def __getattr__(name: str):
    if name in _NAMES:
        module = importlib.import_module(f"qkinspect.composition.{_NAMES[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'qkinspect.composition' has no attribute {name!r}")


class _CompositionModule(types.ModuleType):
    """The package is callable: `qkinspect.composition(model, ...)` is `qkinspect.composition.run.composition`
    (the package keeps its name, the library call its documented spelling)."""

    def __call__(self, *args, **kwargs):
        from qkinspect.composition.run import composition

        return composition(*args, **kwargs)

    @property
    def __signature__(self):
        """The call's own signature, so that `inspect.signature(qkinspect.composition)` and help name its
        arguments."""
        import inspect

        from qkinspect.composition.run import composition

        return inspect.signature(composition)


sys.modules[__name__].__class__ = _CompositionModule

__all__ = sorted(_NAMES)
