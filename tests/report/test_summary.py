"""The report's plain-words summary: each sentence says what the records hold, and only when they hold it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from qkinspect.report.summary import summary
from tests.report import synthetic


def _text(result) -> str:
    return " ".join(p for s in summary(result) for p in s.paragraphs)


def test_sharing_sentence_names_the_median_and_the_closest_head():
    r = synthetic.result(synthetic.block(n_layers=2, n_heads=3))
    dist = np.linspace(0.95, 0.45, len(r.heads))  # the last head is the closest to a shared matrix
    heads = tuple(replace(h, values={**h.values, "shared_qk_distance": float(x)})
                  for h, x in zip(r.heads, dist, strict=True))
    text = _text(replace(r, heads=heads))
    last = heads[-1]
    assert "Could queries and keys share one matrix?" in text
    assert f"The median head's W_Q W_Kᵀ lies {np.median(dist):.3f}" in text
    assert f"The closest is layer {last.layer} head {last.head} (0.450)." in text


def test_no_sharing_sentence_without_the_metric():
    assert "share one matrix?" not in _text(synthetic.result())
