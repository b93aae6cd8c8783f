"""The twins compared: each variant's final held-out loss against the standard twin's, paired by seed.

For the n seeds both finished, d_s = loss(variant, s) − loss(standard, s) (positive: the variant is worse). The
95 % interval is the t-interval mean(d) ± t_{0.975, n−1} · sd(d)/√n. The verdict comes from one-sided t-tests at
the 5 % level against the margin m (nats):

- better: mean(d) < −m (H0 mean(d) ≥ −m rejected);
- worse: mean(d) > m (H0 mean(d) ≤ m rejected);
- not worse: mean(d) < m (H0 mean(d) ≥ m rejected), and not better;
- can't tell: none of these (or fewer than two seeds).

`steps_to_standard`: the first evaluated step at which the variant's held-out loss (mean over its seeds) is at or
below the standard twin's final held-out loss (mean over its seeds); None where it never is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ALPHA = 0.05


@dataclass(frozen=True)
class Paired:
    """The paired difference's mean, its 95 % t-interval, the three one-sided p-values and the verdict."""

    diff: float | None
    ci_low: float | None
    ci_high: float | None
    p_better: float | None
    p_not_worse: float | None
    p_worse: float | None
    verdict: str


def compare(diffs: Sequence[float], margin: float) -> Paired:
    """The verdict on paired differences `diffs` (variant − standard, one per seed) against `margin`."""
    from scipy import stats

    d = [x for x in diffs if x is not None and math.isfinite(x)]
    n = len(d)
    if n == 0:
        return Paired(None, None, None, None, None, None, "can't tell")
    mean = sum(d) / n
    if n < 2:
        return Paired(mean, None, None, None, None, None, "can't tell")
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    se = sd / math.sqrt(n)
    if se == 0:  # identical differences: each test is decided by the mean alone
        p_better, p_not_worse, p_worse = (float(mean < -margin), float(mean < margin), float(mean > margin))
        p_better, p_not_worse, p_worse = 1 - p_better, 1 - p_not_worse, 1 - p_worse
        low = high = mean
    else:
        t = stats.t(df=n - 1)
        half = float(t.ppf(0.975)) * se
        low, high = mean - half, mean + half
        p_better = float(t.cdf((mean + margin) / se))  # H1: mean < −m
        p_not_worse = float(t.cdf((mean - margin) / se))  # H1: mean < m
        p_worse = float(t.sf((mean - margin) / se))  # H1: mean > m
    if p_better < ALPHA:
        verdict = "better"
    elif p_worse < ALPHA:
        verdict = "worse"
    elif p_not_worse < ALPHA:
        verdict = "not worse"
    else:
        verdict = "can't tell"
    return Paired(mean, low, high, p_better, p_not_worse, p_worse, verdict)


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
    """A line for each variant whose chosen learning rate is the smallest or the largest of the grid tried (of
    two or more): its best rate may lie beyond the grid."""
    if len(lrs) < 2:
        return []
    low, high = min(lrs), max(lrs)
    out = []
    for variant, lr in chosen.items():
        if lr in (low, high):
            side, beyond = ("smallest", "below") if lr == low else ("largest", "above")
            out.append(f"learning rate {lr:g} chosen for {variant} is the {side} tried: its best may lie {beyond} "
                       "the grid (widen it)")
    return out
