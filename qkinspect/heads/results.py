"""What `qkinspect.heads` returns: per head, its behaviour scores (each with its standard error over sequences)
beside its weight metrics from `analyze`, and how each weight metric relates to each score (Spearman's ρ with a
bootstrap interval and a permutation p-value, over all heads, within layers pooled, and in each layer).

Example:
    >>> result = qkinspect.heads("path/to/model")  # doctest: +SKIP
    >>> result.relation("symmetry", "self").rho  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from qkinspect.behaviour import SCORES
from qkinspect.documents import envelope, json_safe, model_dict
from qkinspect.layer import ModelInfo
from qkinspect.notebook import Tabular

HEADS_KIND = "heads"  # the document's "kind"
SCORE_TEXT = {
    "previous_token": "attention from p to p-1 (text windows)",
    "induction": "attention from p to the token after the previous occurrence of p's token (repeated random "
                 "tokens; causal models)",
    "duplicate_token": "attention from p to the previous occurrence of p's token (repeated random tokens)",
    "self": "attention from p to p (text windows)",
    "first_token": "attention from p to position 0, BOS or [CLS] (text windows)",
    "entropy": "entropy of p's attention / log(keys p sees), mean over p (text windows): 0 one key, 1 even",
}
DEFINITIONS = {
    **SCORE_TEXT,
    "se": "<score>_se: the standard error of the mean over sequences (sd / √n), one score per sequence",
    "rho": "Spearman's ρ of a weight metric and a score over heads; within: of ranks within each layer, centred "
           "per layer and pooled; low/high: 95 % percentile bootstrap over heads (within layers for within and "
           "layer); p: permutation p-value, (1 + #|ρ*| ≥ |ρ|) / (1 + permutations)",
}
SCOPES = ("all", "within", "layer")


@dataclass(frozen=True)
class HeadsSettings:
    """How the scores were measured: the text and its windows, the repeated random sequences, the weights'
    processing, the resampling, the model's kind (causal or encoder) with the special tokens around each
    sequence (`prefix`: BOS or [CLS]; `suffix`: [SEP]), and the heads selected (`layers`, `heads`; None: all)."""

    text: str
    windows: int
    window: int
    sequences: int
    length: int
    seed: int
    causal: bool
    prefix: int
    suffix: int
    fold_ln: bool
    fold_qk_norm: bool
    metrics: tuple[str, ...]
    relate: tuple[str, ...]
    resamples: int
    permutations: int
    device: str = "cpu"
    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None


@dataclass(frozen=True)
class HeadsRecord:
    """One head: its key/value head, its behaviour scores and their standard errors (None where not measured or
    not defined: induction in an encoder), and its weight metrics as `analyze` measures them."""

    block: str
    layer: int
    head: int
    kv_head: int
    scores: Mapping[str, float | None]
    errors: Mapping[str, float | None]
    weights: Mapping[str, float | None]

    def row(self) -> dict[str, Any]:
        out: dict[str, Any] = {"layer": self.layer, "head": self.head, "kv_head": self.kv_head}
        for s in self.scores:
            out[s] = self.scores[s]
            out[f"{s}_se"] = self.errors.get(s)
        return {**out, **self.weights}


@dataclass(frozen=True)
class RelationRecord:
    """How one weight metric relates to one score: over all heads (`scope` "all"), within layers pooled
    ("within"), or in one layer ("layer", `layer` set)."""

    metric: str
    score: str
    scope: str
    layer: int | None
    rho: float | None
    low: float | None
    high: float | None
    p: float | None
    n: int

    def row(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class HeadsResult(Tabular):
    """Everything `qkinspect.heads` returns. In a notebook it shows `qkinspect heads`' tables; `to_pandas()` is a
    row per head (scores, their errors, weight metrics); `save(path)` writes what `-o FILE.json` writes."""

    model: ModelInfo
    settings: HeadsSettings
    records: list[HeadsRecord]
    relations: list[RelationRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    processing: dict[str, Any] = field(default_factory=dict)  # how analyze measured the weight metrics

    @property
    def scores(self) -> tuple[str, ...]:
        """The scores measured (induction not for an encoder)."""
        return tuple(s for s in SCORES if any(r.scores.get(s) is not None for r in self.records))

    def relation(self, metric: str, score: str, scope: str = "all", layer: int | None = None) -> RelationRecord:
        for r in self.relations:
            if (r.metric, r.score, r.scope, r.layer) == (metric, score, scope, layer):
                return r
        raise KeyError((metric, score, scope, layer))

    def top(self, score: str, n: int = 5) -> list[HeadsRecord]:
        """The `n` heads with the largest `score` (None never)."""
        have = [r for r in self.records if _finite(r.scores.get(score))]
        return sorted(have, key=lambda r: -r.scores[score])[:n]

    def rows(self) -> list[dict[str, Any]]:
        return [r.row() for r in self.records]

    def table_rows(self) -> list[dict[str, Any]]:
        """The CSV's rows: one per head."""
        return self.rows()

    def relation_rows(self) -> list[dict[str, Any]]:
        return [r.row() for r in self.relations]

    def render_table(self, console) -> None:
        from qkinspect.terminal.heads import render_heads

        render_heads(console, self)

    def document(self) -> dict[str, Any]:
        """The JSON document `qkinspect heads -o FILE.json` writes (schema qkinspect/1, kind "heads")."""
        return json_safe(envelope(
            HEADS_KIND, model=model_dict(self.model), settings=asdict(self.settings), definitions=DEFINITIONS,
            heads=self.rows(), relations=self.relation_rows(), warnings=list(self.warnings),
            seconds=dict(self.seconds), processing=dict(self.processing)))

    to_dict = document

    def analysis_document(self) -> dict[str, Any]:
        """An `analyze` document of the same heads whose per-head values are the weight metrics and the behaviour
        scores side by side (no standard errors, no layer records), and the relations over all heads and within layers:
        what the atlas takes from a heads document, so that its depth records, figures and relations table hold
        the scores across models (docs/heads.md, "Across models")."""
        if not self.processing:
            raise ValueError("a heads document written before it kept analyze's processing; run heads again")
        rows = [{"block": r.block, "layer": r.layer, "head": r.head, "kv_head": r.kv_head, **r.weights,
                 **{s: v for s, v in r.scores.items() if s in self.scores}} for r in self.records]
        # the relations over all heads and within layers, with their block: the atlas's table across models
        relations = [{"block": self.records[0].block, **r.row()} for r in self.relations if r.scope != "layer"]
        return json_safe(envelope("analyze", model=model_dict(self.model), processing=dict(self.processing),
                                  definitions={**DEFINITIONS}, baselines=[], heads=rows, layers=[],
                                  warnings=list(self.warnings), relations=relations))

    def headvis(self) -> list[dict[str, Any]]:
        """The joined per-head table as tidy long rows for viewers (one row per head and quantity: layer, head,
        kv_head, name, kind "behaviour" or "weight", value, se); docs/heads.md, "Viewers", says why this is not
        Neuronpedia's own layout."""
        out = []
        for r in self.records:
            base = {"layer": r.layer, "head": r.head, "kv_head": r.kv_head}
            for s, v in r.scores.items():
                out.append({**base, "name": s, "kind": "behaviour", "value": v, "se": r.errors.get(s)})
            for m, v in r.weights.items():
                out.append({**base, "name": m, "kind": "weight", "value": v, "se": None})
        return json_safe(out)


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)
