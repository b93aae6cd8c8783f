"""Each head's top singular directions of W_V W_O and W_Q W_Kᵀ, read as tokens (docs/directions.md).

Rooms: `run` (`directions`), `results` (`DirectionsResult`, its records). Its table for people is
`qkinspect.terminal.directions`, its PDF `qkinspect.report.directions`.

    qkinspect.directions(model, ...) -> DirectionsResult    (the package is callable)
"""

from __future__ import annotations

from qkinspect.faces import make_face

_NAMES = {"directions": "run", "DirectionsResult": "results", "DirectionRecord": "results"}

make_face(__name__, _NAMES, call="directions")

__all__ = sorted(_NAMES)
