"""Two analyses of one architecture compared head for head (a base model and its fine-tune, two training steps):
the shapes checked to line up, the metrics both computed, and per head each metric's values and their difference,
B − A (`qkinspect compare` writes them; its table: `qkinspect.terminal.compare`)."""

from __future__ import annotations

import math
from typing import Any

from qkinspect.errors import InputError
from qkinspect.layer import shape_differences


def check_same_shapes(a, b) -> None:
    """InputError naming every difference when two models' attention blocks do not line up head for head."""
    sa, sb = [x.key for x in a.blocks], [x.key for x in b.blocks]
    if sa != sb:
        raise InputError(f"cannot compare: {a.name} has blocks {', '.join(sa)} but {b.name} has {', '.join(sb)}")
    diffs = shape_differences(a, b)
    if diffs:
        raise InputError(f"cannot compare {a.name} with {b.name}: shapes differ ({'; '.join(diffs)})")


def common_metrics(a, b) -> list[str]:
    """Head metrics both results computed, in A's order."""
    in_b = {k for h in b.heads for k in h.values}
    names = list(a.metric_names) or sorted({k for h in a.heads for k in h.values})
    return [m for m in names if m in in_b and any(m in h.values for h in a.heads)]


def head_deltas(a, b) -> list[dict[str, Any]]:
    """One row per head: block, layer, head, kv_head, then per metric `{m}_a`, `{m}_b` and `delta_{m}` (B − A)."""
    names = common_metrics(a, b)
    other = {(h.block, h.layer, h.head): h for h in b.heads}
    rows = []
    for ha in a.heads:
        hb = other.get((ha.block, ha.layer, ha.head))
        if hb is None:
            continue
        row: dict[str, Any] = {"block": ha.block, "layer": ha.layer, "head": ha.head, "kv_head": ha.kv_head}
        for m in names:
            va, vb = ha.values.get(m), hb.values.get(m)
            row[f"{m}_a"], row[f"{m}_b"], row[f"delta_{m}"] = va, vb, _diff(vb, va)
        rows.append(row)
    return rows


def _diff(x, y) -> float:
    if x is None or y is None:
        return math.nan
    return float(x) - float(y)
