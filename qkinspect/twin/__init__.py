"""Twin training from scratch (docs/twin.md): the same small transformer trained from the same seeds on the same
text, with W_Q and W_K as usual and under each constraint, every constraint the parametrised form healing keeps.

Rooms: `request` (the request checked, torch-free), `data` (text, tokenizer, batches), `model` (the twins built
from transformers' classes), `train` (one run, the sweep engine's task), `run` (`twin`, the orchestrator),
`summary` (paired differences, t-intervals, two one-sided tests), `results` (the records), `saved` (the checked
reader of a twin folder).
"""

from __future__ import annotations

from qkinspect.faces import make_face

_NAMES = {"twin": "run", "read_twin": "saved"}

make_face(__name__, _NAMES, call="twin")

__all__ = sorted(_NAMES)
