"""What the heads do: behaviour scores per head (previous-token, induction, duplicate-token, self, first-token,
entropy) from the model's own attention, beside the weight metrics of `analyze`, and how the two relate
(docs/heads.md).

Rooms: `request` (the checked request), `scores` (the scores of one layer's attention probabilities), `relate`
(Spearman's ρ with a bootstrap interval and a permutation p-value), `run` (`heads`), `results` (`HeadsResult`, its
records), `saved` (`read`, `is_heads`: the checked reader of a saved document). Its tables for people are
`qkinspect.terminal.heads`, its figure and page `qkinspect.report.heads`.

    qkinspect.heads(model, ...) -> HeadsResult    (the package is callable)
"""

from __future__ import annotations

from qkinspect.faces import make_face

_NAMES = {"heads": "run", "HeadsResult": "results", "HeadsRecord": "results", "RelationRecord": "results",
          "HeadsRequest": "request", "read": "saved", "is_heads": "saved"}

make_face(__name__, _NAMES, call="heads")

__all__ = sorted(_NAMES)
