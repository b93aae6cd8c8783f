"""Two analyses of one architecture compared head for head (a base model and its fine-tune, two training steps):
`compare` runs them (one request, checked once; the shapes checked to line up before any work), then the metrics
both computed, and per head each metric's values and their difference, B − A (`qkinspect compare` writes them; its
table: `qkinspect.terminal.compare`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from qkinspect.analysis.request import LIBRARY_NAMES, check_model, check_request
from qkinspect.errors import InputError
from qkinspect.layer import shape_differences
from qkinspect.names import Names

if TYPE_CHECKING:
    from qkinspect.analysis.request import AnalysisRequest
    from qkinspect.analysis.results import AnalysisResult


def compare(model_a, model_b, *, layers: Any = None, heads: Any = None, blocks: Any = None, metrics: Any = None,
            fold_ln: bool = False, fold_qk_norm: bool = False, precision: str = "float32", device: str = "cpu",
            progress=None, names: Names = LIBRARY_NAMES,
            request: AnalysisRequest | None = None) -> tuple[AnalysisResult, AnalysisResult]:
    """The analyses of `model_a` and `model_b` (anything `analyze` takes), with one selection: the request checked
    before either model opens, both models opened and their shapes checked to line up head for head (InputError
    naming every difference) before any weight is read, the selection checked once against them. `names` and
    `request` as `analyze` takes them; `progress` is called for each analysis in turn.

    Example:
        >>> a, b = compare(None, None, layers="0", metrics="symmetry")  # doctest: +SKIP
        >>> head_deltas(a, b)[0]["delta_symmetry"]  # doctest: +SKIP
        0.0
    """
    if request is None:
        request = check_request(metrics, ("qk",), precision, device, fold_ln, fold_qk_norm, names=names,
                                layers=layers, heads=heads, blocks=blocks)
    from qkinspect.loading import opened

    with opened(model_a) as ma, opened(model_b) as mb:
        check_same_shapes(ma.info, mb.info)  # before any work
        specs = check_model(request, ma.info)
        from qkinspect.analysis.engine import measure  # torch: once the request and the models are checked

        return (measure(ma, request, specs, progress=progress), measure(mb, request, specs, progress=progress))


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
