"""The interval of a Spearman ρ (the ρ itself: qkinspect.experiment.results.rank_correlation, the one Spearman).
Pure arithmetic with no qkinspect import, so that every caller (records, report, CLI table) can use it without an
import circle. Words for it: qkinspect.report.rho.rho_text; why this interval: docs/experiments.md, "Rank agreement".
"""

from __future__ import annotations

import math

# Spearman's ρ is shown with a 95 % interval from this many heads on; below, "too few to tell" (report.rho): Fisher's
# z with Bonett & Wright's variance for Spearman (Psychometrika 65, 2000) holds its coverage from about 10 pairs.
MIN_HEADS = 10  # fewer heads: no interval ("too few to tell")
_Z = 1.959963984540054  # the standard normal's 97.5 % quantile: a two-sided 95 % interval


def spearman_interval(rho: float, n: int) -> tuple[float, float] | None:
    """The 95 % interval of Spearman's ρ over `n` pairs (Fisher z with Bonett & Wright's variance); None with
    fewer than MIN_HEADS pairs, or a ρ that is not a number.

    Example:
        >>> lo, hi = spearman_interval(0.5, 20)
        >>> round(lo, 2), round(hi, 2)
        (0.05, 0.78)
    """
    if n < MIN_HEADS or rho is None or not math.isfinite(rho):
        return None
    r = max(-1.0, min(1.0, float(rho)))
    if abs(r) == 1.0:  # z is infinite: take the interval of the nearest ρ the n heads can give below 1 (one
        # adjacent pair of ranks swapped: 1 - 12 / (n³ - n)), closed at ±1
        lo, hi = _interval(math.copysign(1.0 - 12.0 / (n**3 - n), r), n)
        return (lo, 1.0) if r > 0 else (-1.0, hi)
    return _interval(r, n)


def _interval(r: float, n: int) -> tuple[float, float]:
    se = math.sqrt((1.0 + r * r / 2.0) / (n - 3))
    z = math.atanh(r)
    return math.tanh(z - _Z * se), math.tanh(z + _Z * se)
