"""The twins compared: each variant's final held-out loss against the standard twin's, paired by seed.

For the n seeds both finished, d_s = loss(variant, s) − loss(standard, s) (positive: the variant is worse). The
verdict comes from one-sided t-tests at the 5 % level against the margin m (nats), and the interval shown is the
one those tests use: two one-sided tests at 5 % are the 90 % t-interval mean(d) ± t_{0.95, n−1} · sd(d)/√n
against ±m (`LEVEL`).

- better: mean(d) < −m (H0 mean(d) ≥ −m rejected; `p_one_sided_better`);
- worse: mean(d) > m (H0 mean(d) ≤ m rejected; `p_one_sided_worse`);
- not worse: mean(d) < m (H0 mean(d) ≥ m rejected; `p_one_sided_not_worse`), and not better;
- can't tell: none of these (or fewer than two seeds).

The p-values are one-sided p-values of those tests, not probabilities of the claims. With several constrained
variants each of the three tests is a family over the variants, and `holm` adjusts each family's p-values for
multiple comparisons (Holm's step-down, which controls the family-wise error at 5 %): the verdicts use the
adjusted p-values (`corrected`). With one variant they are the raw ones, and the verdict is exactly where the 90 %
interval lies against ±m; with several, an interval that clears the margin can still get "can't tell".

`gap_slope`: how the gap was still moving at the end: per seed, the least-squares slope of d_s over the last
`SLOPE_EVALS` evaluations after step 0 (nats per 1000 steps), then its mean over seeds and the 90 % t-interval.

`steps_to_standard`: the first evaluated step at which the variant's held-out loss (mean over its seeds) is at or
below the standard twin's final held-out loss (mean over its seeds); None where it never is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ALPHA = 0.05
LEVEL = 1 - 2 * ALPHA  # the two one-sided tests at ALPHA are this interval against ±margin
SLOPE_EVALS = 4  # the last evaluations (after step 0) the gap's slope is fitted over
PER_STEPS = 1000  # the slope's unit: nats per this many steps


@dataclass(frozen=True)
class Paired:
    """The paired difference's mean, its `LEVEL` t-interval, the three one-sided p-values and the uncorrected
    verdict."""

    diff: float | None
    ci_low: float | None
    ci_high: float | None
    p_one_sided_better: float | None
    p_one_sided_not_worse: float | None
    p_one_sided_worse: float | None
    verdict: str


def interval(d: Sequence[float]) -> tuple[float, float | None, float | None, float | None]:
    """Mean, `LEVEL` t-interval and standard error of `d` (no interval with fewer than two values)."""
    from scipy import stats

    n = len(d)
    mean = sum(d) / n
    if n < 2:
        return mean, None, None, None
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1)) / math.sqrt(n)
    half = float(stats.t(df=n - 1).ppf(1 - (1 - LEVEL) / 2)) * se
    return mean, mean - half, mean + half, se


def compare(diffs: Sequence[float], margin: float) -> Paired:
    """The verdict on paired differences `diffs` (variant − standard, one per seed) against `margin`."""
    from scipy import stats

    d = [x for x in diffs if x is not None and math.isfinite(x)]
    if not d:
        return Paired(None, None, None, None, None, None, "can't tell")
    mean, low, high, se = interval(d)
    if se is None:
        return Paired(mean, None, None, None, None, None, "can't tell")
    if se == 0:  # identical differences: each test is decided by the mean alone
        p = (float(not mean < -margin), float(not mean < margin), float(not mean > margin))
    else:
        t = stats.t(df=len(d) - 1)
        p = (float(t.cdf((mean + margin) / se)),  # H1: mean < −m
             float(t.cdf((mean - margin) / se)),  # H1: mean < m
             float(t.sf((mean - margin) / se)))  # H1: mean > m
    return Paired(mean, low, high, *p, verdict_of(*p))


def verdict_of(p_better: float | None, p_not_worse: float | None, p_worse: float | None) -> str:
    """The verdict from the three tests' p-values (raw or adjusted) at `ALPHA`."""
    if p_better is None or p_not_worse is None or p_worse is None:
        return "can't tell"
    if p_better < ALPHA:
        return "better"
    if p_worse < ALPHA:
        return "worse"
    if p_not_worse < ALPHA:
        return "not worse"
    return "can't tell"


def holm(ps: Sequence[float | None]) -> list[float | None]:
    """Holm's adjusted p-values of one family (None: no test, left out of the family): the i-th smallest of m is
    max over j ≤ i of min(1, (m − j + 1) p_(j)), so each is at least its raw value and their order is kept."""
    tested = sorted((p, i) for i, p in enumerate(ps) if p is not None)
    m = len(tested)
    out: list[float | None] = [None] * len(ps)
    running = 0.0
    for j, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - j) * p))
        out[i] = running
    return out


@dataclass(frozen=True)
class Corrected:
    """One variant's Holm-adjusted p-values (over the `family` variants tested) and the verdict they give."""

    p_holm_better: float | None
    p_holm_not_worse: float | None
    p_holm_worse: float | None
    verdict: str
    family: int


def corrected(paired: Sequence[Paired]) -> list[Corrected]:
    """The verdicts of several variants' comparisons, each test's family Holm-adjusted over the variants."""
    cols = [holm([getattr(p, f"p_one_sided_{k}") for p in paired]) for k in ("better", "not_worse", "worse")]
    family = sum(p.p_one_sided_better is not None for p in paired)
    return [Corrected(b, n, w, verdict_of(b, n, w), family) for b, n, w in zip(*cols, strict=True)]


@dataclass(frozen=True)
class Slope:
    """The gap's slope (nats per `PER_STEPS` steps) over the evaluations from step `start` to the end: the mean
    over seeds of each seed's least-squares slope, and its `LEVEL` t-interval (None with one seed)."""

    slope: float | None
    low: float | None
    high: float | None
    start: int | None


def gap_slope(per_seed: Sequence[Mapping[int, float]]) -> Slope:
    """`per_seed`: each seed's paired gap (step -> variant − standard). Fitted over the last `SLOPE_EVALS` steps
    after step 0 that every seed has; no slope with fewer than two such steps."""
    if not per_seed:
        return Slope(None, None, None, None)
    common = sorted(set.intersection(*(set(c) for c in per_seed)) - {0})[-SLOPE_EVALS:]
    if len(common) < 2:
        return Slope(None, None, None, None)
    xbar = sum(common) / len(common)
    sxx = sum((x - xbar) ** 2 for x in common)
    slopes = []
    for c in per_seed:
        ybar = sum(c[x] for x in common) / len(common)
        slopes.append(PER_STEPS * sum((x - xbar) * (c[x] - ybar) for x in common) / sxx)
    mean, low, high, _ = interval(slopes)
    return Slope(mean, low, high, common[0])


def steps_to(curve: dict[int, float], target: float | None) -> int | None:
    """The first step of `curve` (step -> mean held-out loss) at or below `target`."""
    if target is None:
        return None
    return next((k for k in sorted(curve) if curve[k] <= target), None)


def best_lr(losses: Mapping[float, float | None]) -> float | None:
    """The learning rate whose run (seed 0) ended with the lowest held-out loss, the lower rate on a tie; None where
    no run finished. The one rule of the lr sweep: the orchestrator runs every seed at it, the reader reports it."""
    tried = [(loss, lr) for lr, loss in losses.items() if loss is not None]
    return min(tried)[1] if tried else None


def edge_notes(chosen: Mapping[str, float], lrs: Sequence[float]) -> list[str]:
    """A line for each edge of a grid of two or more learning rates that some variant chose (the variants named):
    their best rate may lie beyond the grid."""
    if len(lrs) < 2:
        return []
    out = []
    for lr, side, beyond in ((min(lrs), "smallest", "below"), (max(lrs), "largest", "above")):
        at = [v for v, x in chosen.items() if x == lr]
        if at:
            names = at[0] if len(at) == 1 else f"{', '.join(at[:-1])} and {at[-1]}"
            out.append(f"learning rate {lr:g}, the {side} tried, chosen for {names}: the best may lie {beyond} the "
                       "grid (widen it)")
    return out
