"""The experiment section's numbers, read from the JSON `qkinspect experiment` writes (docs/experiments.md): what
each edit costs, which heads share one matrix for queries and keys almost for free, and whether the weight-space
prediction orders the heads by their cost. Only arithmetic on recorded losses here: nothing is run or measured."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from qkinspect.errors import InputError
from qkinspect.experiment.results import SIGNIFICANT, beyond_error

FREE_RATIO = 0.1  # a head whose edit costs at most this fraction of removing it shares "almost for free"
SHARE = "share_qk"  # the edit the section's questions are about: one matrix for queries and keys
IDENTITY = ("source", "revision", "model_type", "format", "architecture")
BLOCK_SHAPE = ("name", "n_layers", "n_heads", "n_kv_heads", "d_model", "d_head")


@dataclass(frozen=True)
class EditCost:
    """What one edit cost the model: `dloss` at `scope` ("model", or summed over "layer"/"head" runs), and the
    same against ablating the same units (`ratio`, None without ablate runs or when ablating cost nothing)."""

    edit: str
    scope: str
    units: int
    dloss: float
    ratio: float | None


@dataclass(frozen=True)
class HeadCost:
    layer: int
    head: int
    dloss: float
    ratio: float | None
    predicted: float | None
    se: float | None = None  # the standard error of dloss (runs written before it was recorded: None)
    ablate: float | None = None  # dloss of ablating the same head, and its standard error
    ablate_se: float | None = None

    @property
    def beyond_error(self) -> bool:
        """Whether dloss is further than SIGNIFICANT standard errors from 0."""
        return beyond_error(self.dloss, self.se)


@dataclass(frozen=True)
class Prediction:
    """Spearman's rank correlation of an edit's weight-space prediction against its Δloss over the heads."""

    edit: str
    predictor: str
    n: int
    rho: float
    p: float


def check_same_model(doc: dict[str, Any], model: dict[str, Any], path: object) -> None:
    """InputError (one line) unless the experiment in `doc` was run on `model` (a `model_dict`)."""
    ran = doc.get("model") or {}
    for key in IDENTITY:
        if ran.get(key) != model.get(key):
            raise InputError(f"{path}: the experiment was run on {ran.get('name')!r} ({key} {ran.get(key)!r}), "
                             f"not on this model ({key} {model.get(key)!r})")
    shapes = [[b.get(k) for k in BLOCK_SHAPE] for b in ran.get("blocks") or []]
    if shapes != [[b.get(k) for k in BLOCK_SHAPE] for b in model.get("blocks") or []]:
        raise InputError(f"{path}: the experiment's model has other attention blocks than this model")


def _runs(doc: dict[str, Any], edit: str, scope: str) -> list[dict[str, Any]]:
    return [r for r in doc["runs"] if r["edit"] == edit and r["scope"] == scope and r.get("dloss") is not None]


def edits(doc: dict[str, Any]) -> list[str]:
    """The edits of the runs, in order, `ablate` last (it is the yardstick)."""
    names = list(dict.fromkeys(r["edit"] for r in doc["runs"] if r.get("dloss") is not None))
    return [e for e in names if e != "ablate"] + [e for e in names if e == "ablate"]


def edit_cost(doc: dict[str, Any], edit: str) -> EditCost | None:
    """The edit's cost at the widest scope it was run at; None when it has no run with a loss."""
    for scope in ("model", "layer", "head"):
        runs = _runs(doc, edit, scope)
        if not runs:
            continue
        ablate = {(r["layer"], r["head"]): r["dloss"] for r in _runs(doc, "ablate", scope)}
        ablate_se = {(r["layer"], r["head"]): r.get("dloss_se") for r in _runs(doc, "ablate", scope)}
        dloss = math.fsum(r["dloss"] for r in runs)
        units = [(r["layer"], r["head"]) for r in runs]
        ratio = None
        if all(u in ablate for u in units):
            total = math.fsum(ablate[u] for u in units)
            # the summed ablation must cost beyond its error: Σ se bounds the error of a sum of runs on the same
            # tokens (correlated) from above; runs written without standard errors need only a positive cost
            ses = [ablate_se.get(u) for u in units]
            bound = 0.0 if any(x is None for x in ses) else SIGNIFICANT * math.fsum(ses)  # type: ignore[arg-type]
            ratio = dloss / total if total > bound and total > 0 else None
        return EditCost(edit, scope, len(runs), dloss, ratio)
    return None


def head_costs(doc: dict[str, Any], edit: str) -> list[HeadCost]:
    """The edit's head-scope runs, cheapest first (by Δloss)."""
    ablate = {(r["layer"], r["head"]): r for r in _runs(doc, "ablate", "head")}
    rows = []
    for r in _runs(doc, edit, "head"):
        a = ablate.get((r["layer"], r["head"])) or {}
        rows.append(HeadCost(r["layer"], r["head"], r["dloss"], r.get("dloss_ratio_ablate"), r.get("predicted"),
                             r.get("dloss_se"), a.get("dloss"), a.get("dloss_se")))
    return sorted(rows, key=lambda h: (h.dloss, h.layer, h.head))


def free_heads(heads: list[HeadCost]) -> list[HeadCost]:
    """Heads whose edit costs at most FREE_RATIO of ablating them, beyond the error of both: ablating costs more
    than SIGNIFICANT standard errors, and the edit's Δloss plus SIGNIFICANT standard errors stays within
    FREE_RATIO of it (so a cost that noise could hide is never called free)."""
    return [h for h in heads if h.ratio is not None and h.se is not None and h.ablate is not None
            and h.ablate_se is not None and h.ablate > SIGNIFICANT * h.ablate_se
            and h.dloss + SIGNIFICANT * h.se <= FREE_RATIO * h.ablate]


def costly_heads(heads: list[HeadCost]) -> list[HeadCost]:
    """Heads whose edit costs loss beyond its error, costliest first."""
    return sorted((h for h in heads if h.dloss > 0 and h.beyond_error), key=lambda h: (-h.dloss, h.layer, h.head))


def prediction(doc: dict[str, Any], edit: str) -> Prediction | None:
    """Spearman's ρ and its two-sided p-value over the edit's head-scope runs; None with fewer than 3 heads
    or a constant side (ρ is then undefined)."""
    from qkinspect.experiment.results import rank_correlation

    pts = [(h.predicted, h.dloss) for h in head_costs(doc, edit) if h.predicted is not None]
    r = rank_correlation([p[0] for p in pts], [p[1] for p in pts])
    if r is None:
        return None
    return Prediction(edit, str((doc.get("predictors") or {}).get(edit, "prediction")), len(pts), *r)


def meaning(p: Prediction) -> str:
    """What ρ and p say, in words (over fewer than report.rho.MIN_HEADS heads: that they are too few to tell)."""
    from qkinspect.experiment.rank_interval import MIN_HEADS

    if p.n < MIN_HEADS:
        return (f"{p.n} heads are too few to tell whether {p.predictor} orders the heads by what {p.edit} costs "
                f"them (qkinspect reads ρ from {MIN_HEADS} heads on)")
    if p.p >= 0.05:
        return (f"no evidence that {p.predictor} orders the heads by what {p.edit} costs them: a ρ this far from "
                f"0 comes out by chance with probability {p.p:.2g} over {p.n} heads")
    if p.rho > 0:
        strength = "closely" if p.rho >= 0.7 else "partly" if p.rho >= 0.4 else "weakly"
        return (f"{p.predictor} {strength} predicts the cost: heads it puts further from the edit lose more loss "
                f"when edited (unlikely by chance, p = {p.p:.2g})")
    return (f"the opposite of a prediction: heads {p.predictor} puts further from the edit lose less loss "
            f"(p = {p.p:.2g})")
