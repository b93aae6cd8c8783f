"""What an experiment's runs say each edit costs, computed from its records (qkinspect.experiment.results), never
by running the model again: an edit's cost at the widest scope it was run at, summed exactly over its runs
(`edit_cost`, with its ratio to ablating the same units only where the summed ablation costs beyond its error);
each head's cost beside ablating it (`head_costs`), the heads that share almost for free and those that cost beyond
their error; the mean Δloss per K of `rank:K` edits (`rank_points`); and Spearman's ρ of the weight-space
prediction against Δloss (`prediction`). `report/` puts these numbers into words and figures.

Example:
    >>> result = read_experiment(Path("runs.json"))  # doctest: +SKIP
    >>> edit_cost(result, "share_qk").ratio  # Δloss summed over the heads / ablating them  # doctest: +SKIP
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from qkinspect.experiment.results import SIGNIFICANT, ExperimentResult, Run, beyond_error, rank_correlation

FREE_RATIO = 0.1  # a head whose edit costs at most this fraction of removing it shares "almost for free"
SCOPES_WIDEST_FIRST = ("model", "layer", "head")


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


def measured(result: ExperimentResult, scope: str, edit: str | None = None) -> list[Run]:
    """The runs at `scope` (of `edit`, or of every edit) that were run exactly (they have a Δloss)."""
    return [r for r in result.runs if r.scope == scope and r.dloss is not None and edit in (None, r.edit)]


def edits(result: ExperimentResult) -> list[str]:
    """The edits of the runs with a Δloss, in order, `ablate` last (it is the yardstick)."""
    names = list(dict.fromkeys(r.edit for r in result.runs if r.dloss is not None))
    return [e for e in names if e != "ablate"] + [e for e in names if e == "ablate"]


def edit_cost(result: ExperimentResult, edit: str) -> EditCost | None:
    """The edit's cost at the widest scope it was run at; None when it has no run with a loss."""
    for scope in SCOPES_WIDEST_FIRST:
        runs = measured(result, scope, edit)
        if not runs:
            continue
        ablate = {(r.layer, r.head): r for r in measured(result, scope, "ablate")}
        dloss = math.fsum(r.dloss for r in runs)  # type: ignore[misc]
        units = [(r.layer, r.head) for r in runs]
        ratio = None
        if all(u in ablate for u in units):
            total = math.fsum(ablate[u].dloss for u in units)  # type: ignore[misc]
            # the summed ablation must cost beyond its error: Σ se bounds the error of a sum of runs on the same
            # tokens (correlated) from above; runs written without standard errors need only a positive cost
            ses = [ablate[u].dloss_se for u in units]
            bound = 0.0 if any(x is None for x in ses) else SIGNIFICANT * math.fsum(ses)  # type: ignore[arg-type]
            ratio = dloss / total if total > bound and total > 0 else None
        return EditCost(edit, scope, len(runs), dloss, ratio)
    return None


def head_costs(result: ExperimentResult, edit: str) -> list[HeadCost]:
    """The edit's head-scope runs, cheapest first (by Δloss), each beside ablating the same head."""
    ablate = {(r.layer, r.head): r for r in measured(result, "head", "ablate")}
    rows = []
    for r in measured(result, "head", edit):
        a = ablate.get((r.layer, r.head))
        rows.append(HeadCost(r.layer, r.head, r.dloss, r.ratio, r.predicted, r.dloss_se,  # type: ignore[arg-type]
                             a and a.dloss, a and a.dloss_se))
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


def prediction(result: ExperimentResult, edit: str) -> Prediction | None:
    """Spearman's ρ and its two-sided p-value over the edit's head-scope runs; None with fewer than 3 heads
    or a constant side (ρ is then undefined)."""
    pts = [(h.predicted, h.dloss) for h in head_costs(result, edit) if h.predicted is not None]
    r = rank_correlation([p[0] for p in pts], [p[1] for p in pts])
    if r is None:
        return None
    return Prediction(edit, str(result.predictors.get(edit, "prediction")), len(pts), *r)


def rank_points(result: ExperimentResult) -> list[tuple[int, float]]:
    """(K, mean Δloss) per `rank:K` edit, K ascending, at the widest scope that holds two K or more (one scope: a
    model's Δloss and a head's are not averaged together), the mean over that scope's runs (layers or heads);
    empty when no scope holds two."""
    return [(k, float(np.mean([r.dloss for r in runs]))) for k, runs in _rank_runs(result)]


def rank_errors(result: ExperimentResult) -> list[float | None]:
    """Beside each of `rank_points`: the mean of its runs' standard errors, which bounds the standard error of
    their mean from above (the runs score the same tokens, so their errors are correlated, at most fully); None
    where a run has no standard error."""
    out = []
    for _, runs in _rank_runs(result):
        ses = [r.dloss_se for r in runs]
        out.append(None if any(x is None for x in ses) else float(np.mean(ses)))
    return out


def typical_se(runs: list[Run]) -> tuple[float, float] | None:
    """(median, largest) standard error of the runs' Δloss; None when a run has none (or there are no runs)."""
    ses = [r.dloss_se for r in runs]
    if not ses or any(x is None for x in ses):
        return None
    return float(np.median(ses)), float(max(ses))  # type: ignore[type-var]


def _rank_runs(result: ExperimentResult) -> list[tuple[int, list[Run]]]:
    """The `rank:K` runs by K, ascending, at the widest scope that holds two K or more; empty when none does."""
    for scope in SCOPES_WIDEST_FIRST:
        by_k: dict[int, list[Run]] = {}
        for r in measured(result, scope):
            if r.edit.startswith("rank:"):
                by_k.setdefault(int(r.edit.split(":")[1]), []).append(r)
        if len(by_k) >= 2:
            return sorted(by_k.items())
    return []
