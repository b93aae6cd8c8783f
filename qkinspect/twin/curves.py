"""The twins over training, as the figures draw them: each statistic over seeds computed here, from a Twin's
records, so that `qkinspect.report.twin` only arranges rows (docs/twin.md).

Every curve is at each variant's chosen learning rate (its `VariantSummary.lr`) and over the seeds its summary
counts (0 … seeds − 1); a step enters where every one of those seeds has a value.

- `learning_curves`: held-out loss per (variant, step): mean over seeds and the sample standard deviation (±1 s.d.
  is the seed-to-seed spread, not an interval of the mean).
- `gap_curves`: per (variant, step) the paired difference variant − standard over the seeds both have, its mean and
  90 % t-interval (`qkinspect.twin.summary.compare`, the summary's own statistics, at every evaluated step).
- `trajectory_curves`: a tracked metric per (variant, layer, step): each seed's median over the layer's heads,
  then their mean and standard deviation over seeds.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass

from qkinspect.errors import InputError
from qkinspect.twin.results import TwinResult
from qkinspect.twin.summary import compare


@dataclass(frozen=True)
class CurvePoint:
    """One variant's value at one step over `seeds` seeds: their mean and sample s.d. (None for one seed)."""

    variant: str
    step: int
    seeds: int
    mean: float
    sd: float | None
    layer: int | None = None  # trajectories: the layer whose heads' median this is


@dataclass(frozen=True)
class GapPoint:
    """variant − standard held-out loss at one step, paired by seed: mean and 90 % t-interval (None: < 2 seeds)."""

    variant: str
    step: int
    seeds: int
    diff: float
    ci_low: float | None
    ci_high: float | None


def chosen(twin: TwinResult) -> dict[str, tuple[float, int]]:
    """variant -> (its chosen learning rate, how many seeds its summary counts), in the summary's order."""
    return {s.variant: (s.lr, twin.setup.get("plan", {}).get("seeds", s.seeds)) for s in twin.summaries}


def margin(twin: TwinResult) -> float | None:
    """The two one-sided tests' margin in nats (the plan's), None where the folder does not say."""
    m = twin.setup.get("plan", {}).get("margin")
    return float(m) if isinstance(m, (int, float)) else None


def _losses(twin: TwinResult) -> dict[str, dict[int, dict[int, float]]]:
    """variant -> step -> seed -> held-out loss, at the chosen rate and counted seeds."""
    keep = chosen(twin)
    out: dict = defaultdict(lambda: defaultdict(dict))
    for p in twin.points:
        if p.variant in keep and p.lr == keep[p.variant][0] and p.seed < keep[p.variant][1]:
            out[p.variant][p.step][p.seed] = p.val_loss
    return out


def _mean_sd(values: list[float]) -> tuple[float, float | None]:
    return statistics.fmean(values), seed_sd(values)


def learning_curves(twin: TwinResult) -> list[CurvePoint]:
    """Held-out loss per (variant, step): mean and s.d. over the seeds, where every seed was evaluated."""
    out = []
    for variant, steps in _losses(twin).items():
        n = len({s for by_seed in steps.values() for s in by_seed})
        for step in sorted(steps):
            if len(steps[step]) == n:
                mean, sd = _mean_sd([steps[step][s] for s in sorted(steps[step])])
                out.append(CurvePoint(variant, step, n, mean, sd))
    return out


def gap_curves(twin: TwinResult) -> list[GapPoint]:
    """variant − standard per (variant, step), paired by seed over the seeds both evaluated at that step."""
    losses = _losses(twin)
    std = losses.get("standard", {})
    m = margin(twin) or 0.0
    out = []
    for variant, steps in losses.items():
        if variant == "standard":
            continue
        for step in sorted(set(steps) & set(std)):
            seeds = sorted(set(steps[step]) & set(std[step]))
            if seeds:
                paired = compare([steps[step][s] - std[step][s] for s in seeds], m)
                out.append(GapPoint(variant, step, len(seeds), paired.diff, paired.ci_low, paired.ci_high))
    return out


def tracked_metrics(twin: TwinResult) -> list[str]:
    """The metrics the runs tracked (`--track-every`), in the order first met."""
    return list(dict.fromkeys(t.metric for t in twin.trajectories))


def trajectory_curves(twin: TwinResult, metric: str) -> list[CurvePoint]:
    """`metric` per (variant, layer, step): each seed's median over the layer's heads, then mean and s.d. over
    the seeds that have it. InputError where the runs did not track it."""
    have = tracked_metrics(twin)
    if metric not in have:
        raise InputError(f"--metric {metric}: {twin.folder} has no trajectory of it; "
                         + (f"it tracked {', '.join(have)}" if have else "its runs were not tracked "
                            "(qkinspect twin --track-every N)"))
    keep = chosen(twin)
    heads: dict = defaultdict(list)  # (variant, layer, step, seed) -> the heads' values
    for t in twin.trajectories:
        if t.metric == metric and t.variant in keep and t.lr == keep[t.variant][0] and t.seed < keep[t.variant][1] \
                and t.value is not None and math.isfinite(t.value):
            heads[t.variant, t.layer, t.step, t.seed].append(t.value)
    by: dict = defaultdict(dict)
    for (variant, layer, step, seed), values in heads.items():
        by[variant, layer, step][seed] = statistics.median(values)
    out = []
    for variant in keep:
        for (v, layer, step), seeds in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][2])):
            if v == variant:
                mean, sd = _mean_sd([seeds[s] for s in sorted(seeds)])
                out.append(CurvePoint(variant, step, len(seeds), mean, sd, layer))
    return out


def seed_sd(values: tuple[float, ...] | list[float]) -> float | None:
    """The sample standard deviation of one value per seed (a summary's `val_losses`); None for fewer than two."""
    return statistics.stdev(values) if len(values) > 1 else None
