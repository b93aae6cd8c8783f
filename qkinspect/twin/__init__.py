"""Twin training from scratch (docs/twin.md): the same small transformer trained from the same seeds on the same
text, with W_Q and W_K as usual and under each constraint, every constraint the parametrised form healing keeps.

Rooms: `request` (the request checked, torch-free), `data` (text, tokenizer, batches), `model` (the twins built
from transformers' classes), `train` (one run, the sweep engine's task), `run` (`twin`, the orchestrator),
`summary` (paired differences, t-intervals, two one-sided tests), `results` (the records), `saved` (the checked
reader of a twin folder).
"""

from __future__ import annotations

import sys
import types

__all__ = ["read_twin", "twin"]


def __getattr__(name: str):
    if name == "twin":
        from qkinspect.twin.run import twin

        return twin
    if name == "read_twin":
        from qkinspect.twin.saved import read_twin

        return read_twin
    raise AttributeError(f"module 'qkinspect.twin' has no attribute {name!r}")


class _TwinModule(types.ModuleType):
    """The package is callable: `qkinspect.twin(out, ...)` is `qkinspect.twin.run.twin` (the package keeps its
    name, the library call its documented spelling)."""

    def __call__(self, *args, **kwargs):
        from qkinspect.twin.run import twin

        return twin(*args, **kwargs)


sys.modules[__name__].__class__ = _TwinModule
