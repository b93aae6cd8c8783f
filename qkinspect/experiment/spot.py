"""The estimate's spot check (docs/experiments.md, "Unreliable heads"): for each edit, the quarter of the heads whose
change is largest against their layer's whole attention output (`reach` = |Δo_h| / |o|) is run exactly on a quarter
of the text (whole windows, at least two blocks of positions, a seeded choice), and an estimate is flagged
unreliable where that exact Δloss is far above it: more than SIGNIFICANT of the spot run's standard errors above,
and more than twice it.

A quadratic model of the loss is a Taylor expansion at the clean model; how far along the edit's direction it holds
is not something a quantity at the clean model bounds (on SmolLM2 the loss along Δo_h can stay quadratic up to half
the change and then climb tenfold), so the check evaluates the loss where the edit puts the model, on part of the
text: one forward pass from the head's layer on per candidate, over a quarter of the tokens. Its cost is about a
sixteenth of the exact map's.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import replace

import torch

from qkinspect.experiment.edits.names import Edit
from qkinspect.experiment.exact import make_units, run_unit
from qkinspect.experiment.model.scoring import BLOCK, Scorer
from qkinspect.experiment.results import SIGNIFICANT
from qkinspect.layer import AttentionLayer
from qkinspect.progress import phase

SPOT_SHARE = 4  # the spot check runs on 1/SPOT_SHARE of each edit's heads, on 1/SPOT_SHARE of the windows


def candidates(found: list) -> list:
    """Per edit, the ⌈n / SPOT_SHARE⌉ of its n HeadEstimates with the largest reach (ties: layer, head order)."""
    out = []
    for edit in dict.fromkeys(x.edit for x in found):
        mine = [x for x in found if x.edit == edit]
        out += sorted(mine, key=lambda x: -x.reach)[:math.ceil(len(mine) / SPOT_SHARE)]
    return out


def spot_rows(n_windows: int, window: int, seed: int = 0) -> list[int]:
    """The windows the spot check runs on: ⌈n / SPOT_SHARE⌉ of the n, or enough to hold two blocks of BLOCK
    positions (a standard error needs two; all n if they hold fewer), a seeded random choice, in order."""
    k = min(n_windows, max(math.ceil(n_windows / SPOT_SHARE), math.ceil(2 * BLOCK / window)))
    return sorted(random.Random(seed).sample(range(n_windows), k))


def undershoots(estimate: float, exact: float, se: float | None) -> bool:
    """Whether an exact Δloss is far above its estimate: beyond SIGNIFICANT standard errors of the exact run (not
    judged without one) and more than twice the estimate."""
    return se is not None and exact - estimate > SIGNIFICANT * se and exact > 2 * estimate


def spot_check(scorer: Scorer, originals: dict[int, AttentionLayer], found: list, edits: list[Edit], *,
               rotary: str, seed: int = 0, progress: Callable[..., None] | None = None) -> tuple[list, int]:
    """`found` (HeadEstimates) with the `candidates` spot-checked: `spot`, `spot_se` and `unreliable` set. Returns
    them and the tokens each spot run scored (0 when there was nothing to check)."""
    chosen = candidates(found)
    if not chosen:
        return found, 0
    ids = torch.cat(scorer.batches)  # (windows, W)
    spot = Scorer(scorer.hf, ids[spot_rows(ids.shape[0], ids.shape[1], seed)], seed=seed)
    base = spot.baseline(cache={x.layer for x in chosen})
    by_name = {str(e): e for e in edits}
    tick = phase(progress, "estimate: spot checks", len(chosen), "exact runs on part of the text")
    checked = {}
    for done, x in enumerate(chosen):
        (unit,) = make_units("head", [x.layer], [x.head])
        r = run_unit(spot, spot.hf, originals, unit, by_name[x.edit], "head", base, rotary)
        checked[(x.layer, x.head, x.edit)] = replace(x, spot=r.dloss, spot_se=r.dloss_se,
                                                     unreliable=undershoots(x.estimate, r.dloss, r.dloss_se))
        tick(done + 1, status=f"{x.edit} L{x.layer} H{x.head}")
    return [checked.get((x.layer, x.head, x.edit), x) for x in found], spot.counted
