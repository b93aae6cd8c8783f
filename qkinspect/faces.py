"""A capability's package face, one way for every capability: its names imported on first use (importing the
package stays cheap: `plot` and `report` ask the atlas's `is_atlas` of every model argument and must not pay for
numpy or torch), and the package callable as its library call (`qkinspect.atlas(models, out=...)` is
`qkinspect.atlas.run.atlas`: the package keeps its name, the call its documented spelling), with the call's own
signature for `inspect.signature` and `help`.

Example (a package's `__init__.py`):
    >>> make_face(__name__, {"atlas": "run", "read_atlas": "saved"}, call="atlas")  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import sys
import types


def make_face(package: str, names: dict[str, str], call: str, room: str = "run") -> None:
    """Make module `package` its capability's face: each name in `names` read from the room it maps to, on first
    use; the module callable as `call` of its `room`."""
    module = sys.modules[package]

    def _target():
        return getattr(importlib.import_module(f"{package}.{room}"), call)

    def __getattr__(name: str):
        if name in names:
            return getattr(importlib.import_module(f"{package}.{names[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    class Face(types.ModuleType):
        def __call__(self, *args, **kwargs):
            return _target()(*args, **kwargs)

        @property
        def __signature__(self):
            import inspect

            return inspect.signature(_target())

    Face.__name__ = Face.__qualname__ = f"{package.rsplit('.', 1)[-1].capitalize()}Module"
    Face.__doc__ = f"The package is callable: `{package}(...)` is `{package}.{room}.{call}`."
    module.__getattr__ = __getattr__
    module.__class__ = Face
