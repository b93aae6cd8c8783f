"""How heads compose across layers (Q-, K- and V-composition), from the weights (docs/composition.md).

Rooms: `run` (`composition`: the scores, layer by layer, in bounded memory), `streams` (which heads compose into
which: the residual streams of each block pair), `results` (`CompositionResult`, its records), `saved`
(`read_composition`, the checked reader of a saved document). Its table for people is
`qkinspect.terminal.composition`, its figure `qkinspect.report.composition`.

    qkinspect.composition(model, ...) -> CompositionResult    (the package is callable)
"""

from __future__ import annotations

from qkinspect.faces import make_face

_NAMES = {"composition": "run", "CompositionResult": "results", "CompositionRecord": "results",
          "read_composition": "saved", "is_composition_document": "saved"}

make_face(__name__, _NAMES, call="composition")

__all__ = sorted(_NAMES)
