"""The atlas's statistics of one model's analysis: pure functions of an `analyze` document (schema qkinspect/1).

For every block of the model (an encoder–decoder model has three: encoder self-attention, decoder self-attention,
cross-attention), and every metric the analysis holds:

- `scope = "model"`: the metric's distribution over every head of the block (all its layers): median, first and
  third quartiles, and `n`, the heads with a finite value; `layer` and `depth` are None.
- `scope = "layer"`: per layer, the same over that layer's heads, at the layer's normalised depth.

The layer form (`symmetry_layer`, `directionality_layer`: the layer's summed form Σ_h W_Q^h W_K^{h // rep}ᵀ, one value
per layer) has `scope = "layer"` records of that one value (`n` = 1, q1 = q3 = median) and a `scope = "model"`
record of its distribution over the layers (the paper's "median over layers").

Normalised depth of layer `l` in a block of `L` layers is `l / (L − 1)`: 0 for the first layer, 1 for the last, so
models of different depths line up. A block of one layer has no first-to-last axis: its layer is drawn at depth 0.5
(`SINGLE_LAYER_DEPTH`), the middle, claiming neither end. `L` is the block's own layer count from the model's shape,
also when the analysis measured only some of its layers.

Quartiles are numpy's default (linear interpolation between order statistics, `np.percentile`); the median is the
50th percentile of that definition, the usual median. Heads whose value is undefined (NaN, stored as null: e.g.
symmetry of a cross-attention head whose query and key widths differ) are left out of `n`; a metric with no finite
value in a block gives no records for that block.

Example:
    >>> records, facts = entry_stats("bert", qkinspect.analyze("bert", layer_form=True).document())  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from qkinspect.atlas.results import AtlasRecord, AtlasRelation  # their fields: RECORD_FIELDS, RELATION_FIELDS

LAYER_FORM = ("symmetry_layer", "directionality_layer")
HEAD_LABELS = ("block", "layer", "head", "kv_head", "rank_q", "rank_k", "rank_v")
SINGLE_LAYER_DEPTH = 0.5


def depth(layer: int, n_layers: int) -> float:
    """Normalised depth `layer / (n_layers − 1)`; SINGLE_LAYER_DEPTH for a block of one layer.

    Example:
        >>> depth(0, 12), depth(11, 12), depth(0, 1)
        (0.0, 1.0, 0.5)
    """
    return SINGLE_LAYER_DEPTH if n_layers <= 1 else layer / (n_layers - 1)


def quartiles(values: Sequence[float]) -> tuple[float | None, float | None, float | None, int]:
    """(median, q1, q3, n) of the finite values; (None, None, None, 0) when there are none.

    Example:
        >>> quartiles([1.0, 2.0, 3.0, float("nan"), 4.0])
        (2.5, 1.75, 3.25, 4)
    """
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if not x.size:
        return None, None, None, 0
    q1, median, q3 = np.percentile(x, [25.0, 50.0, 75.0])
    return float(median), float(q1), float(q3), int(x.size)


def attention_params(block: Mapping[str, Any]) -> int:
    """Attention weights of a block (a `model.blocks[i]` dict): W_Q, W_K, W_V and W_O of every layer (once for a
    block whose layers share one set of weights, as ALBERT's), biases and norms not counted.

    Example:
        >>> attention_params({"n_layers": 12, "n_heads": 12, "n_kv_heads": 12, "d_model": 768, "d_head": 64})
        28311552
    """
    h, g, d = block["n_heads"], block["n_kv_heads"], block["d_head"]
    dq = block["d_model"]
    dk = block.get("d_model_kv") or dq
    dv = block.get("d_head_v") or d
    per_layer = h * dq * d + g * dk * d + g * dk * dv + h * dv * dq
    return per_layer * (1 if block.get("shared_layers") else block["n_layers"])


def block_key(block: Mapping[str, Any]) -> str:
    return block.get("label") or block["name"]


def facts(name: str, model: Mapping[str, Any], entry: str = "model", *, path: str | None = None,
          raw: Sequence[str] = ()) -> list[dict[str, Any]]:
    """One row per block of the model (a dict of FACT_FIELDS, `qkinspect.atlas.results`): the model's facts beside
    its statistics (`kind`: encoder, decoder or cross; `entry`: "model" for a model analysed by the atlas, "saved"
    for a saved analysis; `path`: the model as given; `qk_norm_raw`: a block with q/k norms measured raw, its gains
    not folded in (`raw` names them))."""
    return [{"model": name, "block": block_key(b), "kind": b["name"], "family": model.get("model_type"),
             "format": model.get("format"),
             "layers": b["n_layers"], "heads": b["n_heads"], "kv_heads": b["n_kv_heads"], "d_model": b["d_model"],
             "d_head": b["d_head"], "positional": b.get("positional"), "qk_norm": bool(b.get("qk_norm")),
             "qk_norm_raw": bool(b.get("qk_norm")) and block_key(b) in raw,
             "attention_params": attention_params(b), "entry": entry, "path": name if path is None else path}
            for b in model["blocks"]]


def raw_qk_norm_blocks(doc: Mapping[str, Any]) -> list[str]:
    """The blocks of an analysis document that have q/k norms and were measured raw (their gains not folded)."""
    processing = doc.get("processing") or {}
    if processing.get("fold_qk_norm"):
        return []
    return [block_key(b) for b in doc["model"]["blocks"] if b.get("qk_norm")]


def chance_levels(doc: Mapping[str, Any]) -> dict[tuple[str, str], float]:
    """(block, metric) -> the mean of the analysis's random baseline for that metric: the value Gaussian weights of
    the block's shapes give (for the overlaps ≈ d_head / d_model), the chance level a measured value is read
    against."""
    out = {}
    for b in doc.get("baselines") or []:
        mean = _num(b.get("mean"))
        if mean is not None and math.isfinite(mean) and isinstance(b.get("block"), str) \
                and isinstance(b.get("metric"), str):
            out[(b["block"], b["metric"])] = mean
    return out


def head_metrics(heads: Sequence[Mapping[str, Any]]) -> list[str]:
    """The per-head metrics the records hold, in the order they first appear."""
    return list(dict.fromkeys(k for r in heads for k in r if k not in HEAD_LABELS))


def entry_stats(name: str, doc: Mapping[str, Any], entry: str = "model",
                path: str | None = None) -> tuple[list[AtlasRecord], list[dict]]:
    """(records, facts) of one model's analysis document (`AnalysisResult.document()`, a sweep result's
    `result`, a saved analysis): records (`AtlasRecord`s), block by block in the model's order, then metric
    by metric (per-head metrics in the analysis's order, then the layer form), the model-scope record first.
    `name` names the model in the records, `path` (default: `name`) is the model as it was given; `chance` is the
    metric's random baseline in the block (None where the analysis has none) and `vs_chance` the median over it (for
    the overlaps, whose chance is a level above zero; None for the others)."""
    model = doc["model"]
    chance = chance_levels(doc)
    path = name if path is None else path
    heads, layers = doc.get("heads") or [], doc.get("layers") or []
    records: list[AtlasRecord] = []
    metrics = head_metrics(heads)
    for b in model["blocks"]:
        key, n_layers = block_key(b), b["n_layers"]
        mine = [r for r in heads if r["block"] == key]
        by_layer: dict[int, list[Mapping[str, Any]]] = {}
        for r in mine:
            by_layer.setdefault(r["layer"], []).append(r)
        for metric in metrics:
            whole = quartiles([_num(r.get(metric)) for r in mine])
            if whole[3] == 0:
                continue
            level = chance.get((key, metric))
            records.append(_record(name, key, metric, "model", None, None, whole, level, path))
            for layer in sorted(by_layer):
                stats = quartiles([_num(r.get(metric)) for r in by_layer[layer]])
                if stats[3]:
                    records.append(_record(name, key, metric, "layer", layer, depth(layer, n_layers), stats, level,
                                           path))
        rows = sorted((r for r in layers if r["block"] == key), key=lambda r: r["layer"])
        for metric in LAYER_FORM:
            values = [(r["layer"], _num(r.get(metric))) for r in rows]
            values = [(layer, v) for layer, v in values if v is not None and math.isfinite(v)]
            if not values:
                continue
            level = chance.get((key, metric))
            records.append(_record(name, key, metric, "model", None, None, quartiles([v for _, v in values]), level,
                                   path))
            for layer, v in values:
                records.append(_record(name, key, metric, "layer", layer, depth(layer, n_layers), (v, v, v, 1),
                                       level, path))
    return records, facts(name, model, entry, path=path, raw=raw_qk_norm_blocks(doc))


def entry_relations(name: str, doc: Mapping[str, Any], path: str | None = None) -> list[AtlasRelation]:
    """The relations of one model's analysis with behaviour scores (an atlas task's `relations`, or a heads
    document's), in their stored order: weight metric by weight metric, score by score, all heads then within
    layers; none for an analysis without them."""
    return [AtlasRelation(model=name, block=r["block"], metric=r["metric"], score=r["score"], scope=r["scope"],
                          rho=_num(r.get("rho")), low=_num(r.get("low")), high=_num(r.get("high")),
                          p=_num(r.get("p")), n=r["n"], path=name if path is None else path)
            for r in doc.get("relations") or []]


def _record(model: str, block: str, metric: str, scope: str, layer: int | None, depth_: float | None,
            stats: tuple, chance: float | None = None, path: str | None = None) -> AtlasRecord:
    median, q1, q3, n = stats
    # a ratio to chance where chance is a level above zero: the overlaps (symmetry's chance is ≈ 0, of either sign)
    ratio = median / chance if chance is not None and chance > 0 and metric.startswith("overlap") else None
    return AtlasRecord(model=model, block=block, metric=metric, scope=scope, layer=layer, depth=depth_,
                       median=median, q1=q1, q3=q3, n=n, chance=chance, vs_chance=ratio,
                       path=model if path is None else path)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
