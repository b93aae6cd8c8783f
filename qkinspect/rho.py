"""Spearman's ρ as qkinspect shows it: the 95 % interval and the words. Every ρ shown comes with its number of heads
and a 95 % interval, or, over fewer than MIN_HEADS heads, with "too few to tell" (docs/experiments.md, "Rank
agreement"). The ρ itself: qkinspect.experiment.results.rank_correlation, the one Spearman.

A ground module with no qkinspect import, below experiment/, terminal/ and report/ alike, so that the records, the
terminal tables and the pages all use it without a loop between packages (experiment.results -> terminal.experiment
-> report.rho -> experiment.rank_interval once made one).

The interval is Fisher's z-transform with Bonett & Wright's variance for Spearman's ρ (Psychometrika 65, 2000):
z = atanh(ρ), se = √((1 + ρ²/2) / (n − 3)), and the interval tanh(z ± 1.96 se). Fisher's own 1/(n − 3) is the
variance of Pearson's r under normality and is too narrow for Spearman's; the bootstrap is unreliable over a
dozen points (a resample repeats heads, which ties ranks). Bonett & Wright found the interval close to its nominal
coverage from 10 pairs on, for |ρ| up to about 0.9; below 10 heads qkinspect gives none. At |ρ| = 1 (z infinite)
the interval is that of the nearest ρ the heads can give below 1 (one adjacent pair of ranks swapped), closed at 1:
12 heads in perfect order give 0.97 to 1.00, not a certainty.

Torch- and matplotlib-free: the CLI's experiment output uses it too.
"""

from __future__ import annotations

import math

# Spearman's ρ is shown with a 95 % interval from this many heads on; below, "too few to tell": Fisher's
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


def rho_text(rho: float | None, n: int, what: str = "heads") -> str:
    """Spearman's ρ as every figure, table and report shows it: "ρ = 0.43 (95 % CI 0.02 to 0.72; 24 heads)",
    "ρ = −1.00 over 6 heads: too few to tell", or "ρ undefined (5 heads)" (fewer than 3, or a constant side).

    Example:
        >>> rho_text(-1.0, 6)
        'ρ = −1.00 over 6 heads: too few to tell'
    """
    if n == 1 and what.endswith("s"):
        what = what[:-1]
    if rho is None or not math.isfinite(rho):
        return f"ρ undefined ({n} {what})"
    interval = spearman_interval(rho, n)
    if interval is None:
        return f"ρ = {_num(rho)} over {n} {what}: too few to tell"
    lo, hi = interval
    return f"ρ = {_num(rho)} (95 % CI {_num(lo)} to {_num(hi)}; {n} {what})"


def _num(x: float) -> str:
    """Two decimals with a true minus sign (a hyphen reads as a dash in running text)."""
    return f"{x:.2f}".replace("-", "−")
