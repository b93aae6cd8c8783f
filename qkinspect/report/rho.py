"""How sure a rank correlation is, in words: every Spearman ρ qkinspect shows comes with its number of heads and a
95 % interval, or, over fewer than MIN_HEADS heads, with "too few to tell" (docs/experiments.md, "Rank agreement").
The interval itself: qkinspect.experiment.rank_interval (pure arithmetic: no import circle through the CLI table).

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

from qkinspect.experiment.rank_interval import MIN_HEADS, spearman_interval

__all__ = ["MIN_HEADS", "rho_text", "spearman_interval"]


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
