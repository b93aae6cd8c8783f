"""Each head's top singular directions of W_V W_O and W_Q W_Kᵀ, read as tokens (docs/directions.md).

Rooms: `run` (`directions`), `results` (`DirectionsResult`, its records). Its table for people is
`qkinspect.terminal.directions`, its PDF `qkinspect.report.directions`.

    qkinspect.directions(model, ...) -> DirectionsResult    (the package is callable)
"""

from __future__ import annotations

import importlib
import sys
import types

_NAMES = {"directions": "run", "DirectionsResult": "results", "DirectionRecord": "results"}


def __getattr__(name: str):
    if name in _NAMES:
        module = importlib.import_module(f"qkinspect.directions.{_NAMES[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'qkinspect.directions' has no attribute {name!r}")


class _DirectionsModule(types.ModuleType):
    """The package is callable: `qkinspect.directions(model, ...)` is `qkinspect.directions.run.directions` (the package
    keeps its name, the library call its documented spelling)."""

    def __call__(self, *args, **kwargs):
        from qkinspect.directions.run import directions

        return directions(*args, **kwargs)

    @property
    def __signature__(self):
        """The call's own signature, so that `inspect.signature(qkinspect.directions)` and help name its
        arguments."""
        import inspect

        from qkinspect.directions.run import directions

        return inspect.signature(directions)


sys.modules[__name__].__class__ = _DirectionsModule

__all__ = sorted(_NAMES)
