"""How a constraint's cost moves with model size: gap(N) = a · N^−α fitted to the ladder's paired gaps.

Input, per rung k: N_k (the standard twin's non-embedding parameters) and the paired per-seed gaps g_ks (variant −
standard final held-out loss, nats, one per seed). With the rung's mean gap ḡ_k and its standard error se_k =
sd(g_k·)/√n_k, the fit is the weighted least squares line of log ḡ_k on log N_k with weights w_k = (ḡ_k / se_k)²,
the inverse of log ḡ_k's variance to first order (se_k / ḡ_k): a rung whose seeds agree counts more. The line's
slope is −α, its intercept log a. `residual`: the weighted residuals' root mean square per degree of freedom,
√(Σ w_k r_k² / (K − 2)) (about 1 where the rungs scatter about the line as their seeds say they should; none with
two rungs, which the line passes through exactly).

Whether the line describes the rungs at all: `p_fit`, a lack-of-fit p-value from a parametric bootstrap (three
rungs or more). The statistic is Σ w_k r_k² (the residual's square times K − 2). Under the fitted law each rung's
seeds are drawn again, `DRAWS` times, from a normal distribution about the line's value at N_k with the rung's own
per-seed spread, the means, standard errors and weights computed from the drawn seeds as from the data, the line
refitted and the statistic taken again; `p_fit` is the share of draws whose statistic is at least the data's
((1 + count) / (1 + draws kept)). Drawing the standard errors again is what makes it fair with three seeds a rung:
a standard error from three seeds is itself noisy, so a true power law's statistic is far above its χ² value (a
residual of about 3 is common), and a χ² test would reject true laws. Where `p_fit` < 1 − `LEVEL` the power law is
rejected (`describes` is False): alpha, its interval and a are still given, but the terminal, the report and the
figure say that the line does not describe the shapes and the figure draws no curve.

The interval on α (and the band of the curve): a bootstrap over seeds, `DRAWS` draws from a fixed generator: in each
draw every rung's seeds are drawn with replacement (the rungs' seeds are independent of one another), the means
taken again, and the line refitted with the weights of the data (a draw of three seeds often repeats one, whose
spread would be zero); the percentile interval at `LEVEL` (90 %, the level of the verdicts' two one-sided tests).
A draw in which some rung's mean gap is not above zero has no logarithm and is left out (`dropped` counts them).

No power law is forced where the data cannot carry one (`reason` says why, alpha and a are None):
- fewer than two rungs, or a rung with fewer than two seeds (no spread: neither weights nor a bootstrap);
- a rung whose gaps do not vary across seeds (a zero standard error: an infinite weight);
- the gaps cross zero: a rung whose mean gap is ≤ 0 or whose t-interval at `LEVEL` holds 0. A cost that vanishes or
  changes sign within the ladder is not a power law in N, and says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from qkinspect.twin.summary import LEVEL  # the verdicts' interval: 90 %

DRAWS = 2000
SEED = 0  # the bootstrap's generator: the same folder gives the same interval


@dataclass(frozen=True)
class ScalingFit:
    """The power law of one variant's gap across the ladder's rungs (alpha, a: None with `reason` where none is
    fitted); `rungs`: how many rungs the fit saw; `dropped`: bootstrap draws left out (a mean gap ≤ 0)."""

    variant: str
    rungs: int
    alpha: float | None
    alpha_low: float | None
    alpha_high: float | None
    a: float | None
    residual: float | None
    level: float
    draws: int
    dropped: int
    reason: str | None
    p_fit: float | None = None

    @property
    def describes(self) -> bool | None:
        """Whether the power law describes the rungs: None where none was fitted, True with two rungs (nothing to
        judge by) or where the lack-of-fit test does not reject it at 1 − level, False where it does."""
        if self.alpha is None:
            return None
        return self.p_fit is None or self.p_fit >= 1 - self.level

    def row(self) -> dict[str, object]:
        return asdict(self)


def weighted_line(x: Sequence[float], y: Sequence[float], w: Sequence[float]) -> tuple[float, float]:
    """The weighted least-squares line y ≈ c + b x (minimising Σ w (y − c − b x)²): (c, b)."""
    x, y, w = (np.asarray(v, dtype=np.float64) for v in (x, y, w))
    sw = w.sum()
    mx, my = (w * x).sum() / sw, (w * y).sum() / sw
    sxx = (w * (x - mx) ** 2).sum()
    b = (w * (x - mx) * (y - my)).sum() / sxx
    return float(my - b * mx), float(b)


def _stats(gaps: Sequence[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
    means = np.array([np.mean(g) for g in gaps])
    ses = np.array([np.std(g, ddof=1) / math.sqrt(len(g)) for g in gaps])
    return means, ses


def no_fit_reason(ns: Sequence[float], gaps: Sequence[Sequence[float]], labels: Sequence[str] | None = None,
                  level: float = LEVEL) -> str | None:
    """Why no power law is fitted to these rungs (None where one is)."""
    from scipy import stats

    if len(ns) < 2:
        return "needs at least two shapes"
    if len(set(ns)) < len(ns):
        return "two shapes have the same non-embedding parameters"
    labels = list(labels) if labels is not None else [f"{n:,} parameters" for n in ns]
    for label, g in zip(labels, gaps, strict=True):
        if len(g) < 2:
            return f"needs at least two seeds at every shape ({label} has {len(g)})"
    means, ses = _stats(gaps)
    for label, g, m, se in zip(labels, gaps, means, ses, strict=True):
        if se == 0:
            return f"the gaps at {label} do not vary across seeds (no spread to weight by)"
        half = float(stats.t(df=len(g) - 1).ppf((1 + level) / 2)) * se
        if m - half <= 0:
            return (f"the gaps cross zero: at {label} the gap is {m:+.4f} [{m - half:+.4f}, {m + half:+.4f}] "
                    f"({level:.0%}); a power law needs every shape's gap above zero")
    return None


def fit_power(ns: Sequence[float], gaps: Sequence[Sequence[float]], *, draws: int = DRAWS, level: float = LEVEL,
              seed: int = SEED, labels: Sequence[str] | None = None, variant: str = ""
              ) -> tuple[ScalingFit, np.ndarray]:
    """The fit of gap(N) = a · N^−α to rungs with `ns` parameters and per-seed `gaps` (one sequence per rung), and
    the bootstrap's (log a, α) draws (shape (kept draws, 2); empty where no fit) for the curve's band."""
    reason = no_fit_reason(ns, gaps, labels, level)
    if reason is not None:
        return ScalingFit(variant, len(ns), None, None, None, None, None, level, 0, 0, reason), np.empty((0, 2))
    x = np.log(np.asarray(ns, dtype=np.float64))
    means, ses = _stats(gaps)
    w = (means / ses) ** 2
    c, b = weighted_line(x, np.log(means), w)
    k = len(ns)
    stat = float((w * (np.log(means) - (c + b * x)) ** 2).sum())  # Σ w r²: the residual's and the test's
    residual = math.sqrt(stat / (k - 2)) if k > 2 else None
    rng = np.random.default_rng(seed)
    kept = []
    arrays = [np.asarray(g, dtype=np.float64) for g in gaps]
    for _ in range(draws):
        m = np.array([g[rng.integers(0, len(g), len(g))].mean() for g in arrays])
        if (m <= 0).any():
            continue
        cb, bb = weighted_line(x, np.log(m), w)
        kept.append((cb, -bb))
    boot = np.array(kept).reshape(-1, 2)
    lo, hi = (np.quantile(boot[:, 1], [(1 - level) / 2, (1 + level) / 2]) if len(boot) else (math.nan, math.nan))
    p_fit = lack_of_fit_p(x, c + b * x, arrays, stat, draws=draws, seed=seed) if k > 2 else None
    fit = ScalingFit(variant, k, -b, float(lo) if len(boot) else None, float(hi) if len(boot) else None,
                     float(math.exp(c)), residual, level, draws, draws - len(boot), None, p_fit)
    return fit, boot


def misfit(x: np.ndarray, gaps: Sequence[np.ndarray]) -> float | None:
    """Σ w_k r_k² of the weighted log-log line through rungs at log N = `x` with per-seed `gaps` (None where a rung's
    mean is not above zero or its seeds do not vary: no logarithm or no weight)."""
    means, ses = _stats(gaps)
    if (means <= 0).any() or (ses <= 0).any():
        return None
    w = (means / ses) ** 2
    c, b = weighted_line(x, np.log(means), w)
    return float((w * (np.log(means) - c - b * x) ** 2).sum())


def lack_of_fit_p(x: np.ndarray, log_line: np.ndarray, gaps: Sequence[np.ndarray], observed: float, *,
                  draws: int = DRAWS, seed: int = SEED) -> float | None:
    """The parametric bootstrap's lack-of-fit p-value (the module's docstring): `observed`, the data's misfit (Σ w r²
    of the fitted line), against the misfits of `draws` ladders drawn under the fitted law (rung k: normal about
    exp(log_line[k]) with the rung's per-seed standard deviation, as many seeds as it has). None where no draw could
    be scored."""
    rng = np.random.default_rng([seed, 1])  # a stream of its own: the α bootstrap's draws stay as they were
    centres = np.exp(log_line)
    spreads = [g.std(ddof=1) for g in gaps]
    beyond = kept = 0
    for _ in range(draws):
        drawn = [rng.normal(m, sd, len(g)) for m, sd, g in zip(centres, spreads, gaps, strict=True)]
        s = misfit(x, drawn)
        if s is None:
            continue
        kept += 1
        beyond += s >= observed
    return (1 + beyond) / (1 + kept) if kept else None


def band(boot: np.ndarray, ns: Sequence[float], level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """The pointwise percentile band of a · N^−α over the bootstrap's draws, at `ns`."""
    x = np.log(np.asarray(ns, dtype=np.float64))
    curves = np.exp(boot[:, :1] - boot[:, 1:] * x[None, :])
    return np.quantile(curves, (1 - level) / 2, axis=0), np.quantile(curves, (1 + level) / 2, axis=0)


def fit_variant(variant: str, rungs: Sequence[tuple[str, int, Sequence[float]]]) -> tuple[ScalingFit, np.ndarray]:
    """The variant's fit (and its bootstrap draws) from the ladder's (shape, non-embedding parameters, per-seed
    gaps) per rung."""
    ordered = sorted(rungs, key=lambda r: r[1])
    return fit_power([n for _, n, _ in ordered], [g for _, _, g in ordered], labels=[s for s, _, _ in ordered],
                     variant=variant)
