"""The estimate's spot check (docs/experiments.md, "Unreliable heads"): every head whose edit reaches far into the
residual stream (`reach` above REACH_LIMIT) is run exactly on a quarter of the text, and its estimate is flagged
unreliable where that exact Δloss is far above it: more than SIGNIFICANT of the spot run's standard errors above,
and more than twice it.

A quadratic model of the loss is a Taylor expansion at the clean model; how far along the edit's direction it holds
is not something any quantity at the clean model can bound (on SmolLM2 the loss along Δo_h can be quadratic up to
half the change and then climb tenfold), so the check evaluates the loss where the edit puts the model, on part of
the text: one forward pass from the head's layer on per candidate, over a quarter of the tokens.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import replace

import torch

from qkinspect.experiment.edits.names import Edit
from qkinspect.experiment.exact import make_units, run_unit
from qkinspect.experiment.model.scoring import Scorer
from qkinspect.experiment.results import SIGNIFICANT
from qkinspect.layer import AttentionLayer
from qkinspect.progress import phase

# A head whose edit moves the residual stream by more than this (root mean square over tokens of |Δr_h| / |r|) is
# spot-checked; below it the estimate was good on SmolLM2 and Gemma-3 (docs/experiments.md, "Unreliable heads").
REACH_LIMIT = 0.1
SPOT_SHARE = 4  # the spot check runs on 1/SPOT_SHARE of the windows (at least one)


def spot_rows(n_windows: int, seed: int = 0) -> list[int]:
    """The windows the spot check runs on: ⌈n / SPOT_SHARE⌉ of the n, a seeded random choice, in order."""
    k = max(1, math.ceil(n_windows / SPOT_SHARE))
    return sorted(random.Random(seed).sample(range(n_windows), k))


def undershoots(estimate: float, exact: float, se: float | None) -> bool:
    """Whether an exact Δloss is far above its estimate: beyond SIGNIFICANT standard errors of the exact run (not
    judged without one) and more than twice the estimate."""
    return se is not None and exact - estimate > SIGNIFICANT * se and exact > 2 * estimate


def spot_check(scorer: Scorer, originals: dict[int, AttentionLayer], found: list, edits: list[Edit], *,
               rotary: str, seed: int = 0, progress: Callable[..., None] | None = None) -> tuple[list, int]:
    """`found` (HeadEstimates) with the candidates (reach > REACH_LIMIT) spot-checked: `spot`, `spot_se` and
    `unreliable` set. Returns them and the tokens each spot run scored (0 when there was no candidate)."""
    candidates = [x for x in found if x.reach > REACH_LIMIT]
    if not candidates:
        return found, 0
    ids = torch.cat(scorer.batches)  # (windows, W)
    spot = Scorer(scorer.hf, ids[spot_rows(ids.shape[0], seed)], seed=seed)
    base = spot.baseline(cache={x.layer for x in candidates})
    by_name = {str(e): e for e in edits}
    tick = phase(progress, "estimate: spot checks", len(candidates), "exact runs on part of the text")
    checked = {}
    for done, x in enumerate(candidates):
        (unit,) = make_units("head", [x.layer], [x.head])
        r = run_unit(spot, spot.hf, originals, unit, by_name[x.edit], "head", base, rotary)
        checked[(x.layer, x.head, x.edit)] = replace(x, spot=r.dloss, spot_se=r.dloss_se,
                                                     unreliable=undershoots(x.estimate, r.dloss, r.dloss_se))
        tick(done + 1, status=f"{x.edit} L{x.layer} H{x.head}")
    return [checked.get((x.layer, x.head, x.edit), x) for x in found], spot.counted
