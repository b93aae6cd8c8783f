"""The ladder's scaling fit (qkinspect.twin.scaling): the weighted log-log line against numpy's, a known exponent
recovered with an interval that holds it, the exponent unchanged by a unit of N or of the gap, and the rungs it
refuses to force a power law on."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qkinspect.twin.scaling import band, fit_power, misfit, no_fit_reason, weighted_line

NS = [1.3e4, 5.6e4, 1.0e5, 3.3e5]


def _gaps(alpha: float, a: float, noise: float, seeds: int = 3, seed: int = 0) -> list[list[float]]:
    """Per-seed gaps a · N^−α times a seed's lognormal noise."""
    rng = np.random.default_rng(seed)
    return [list(a * n ** -alpha * np.exp(rng.normal(0, noise, seeds))) for n in NS]


def test_the_line_is_numpys_weighted_polyfit():
    rng = np.random.default_rng(1)
    x, y, w = rng.normal(size=7), rng.normal(size=7), rng.uniform(0.1, 5, size=7)
    c, b = weighted_line(x, y, w)
    # numpy.polyfit weights the residuals themselves: w = sqrt(weight of the squared residual)
    slope, intercept = np.polyfit(x, y, 1, w=np.sqrt(w))
    assert b == pytest.approx(slope, abs=1e-12) and c == pytest.approx(intercept, abs=1e-12)


def test_the_fit_is_the_weighted_log_log_line_by_hand():
    gaps = _gaps(0.4, 3.0, 0.1)
    fit, _ = fit_power(NS, gaps, draws=50)
    means = np.array([np.mean(g) for g in gaps])
    ses = np.array([np.std(g, ddof=1) / math.sqrt(len(g)) for g in gaps])
    w = (means / ses) ** 2
    slope, intercept = np.polyfit(np.log(NS), np.log(means), 1, w=np.sqrt(w))
    assert fit.alpha == pytest.approx(-slope, rel=1e-10) and fit.a == pytest.approx(math.exp(intercept), rel=1e-10)
    resid = np.log(means) - (intercept + slope * np.log(NS))
    assert fit.residual == pytest.approx(math.sqrt((w * resid ** 2).sum() / (len(NS) - 2)), rel=1e-10)


@pytest.mark.parametrize("alpha", [-0.3, 0.2, 0.6])
def test_a_known_exponent_is_recovered_inside_its_interval(alpha):
    fit, boot = fit_power(NS, _gaps(alpha, 2.0, 0.05, seeds=5, seed=3))
    assert fit.reason is None and abs(fit.alpha - alpha) < 0.05
    assert fit.alpha_low <= alpha <= fit.alpha_high and fit.alpha_high - fit.alpha_low < 0.2
    low, high = band(boot, NS)
    truth = 2.0 * np.asarray(NS) ** -alpha
    assert (low <= high).all() and (low < truth * 1.1).all() and (high > truth * 0.9).all()


def test_noisier_seeds_give_a_wider_interval():
    tight, _ = fit_power(NS, _gaps(0.3, 2.0, 0.02, seeds=4))
    loose, _ = fit_power(NS, _gaps(0.3, 2.0, 0.3, seeds=4))
    assert loose.alpha_high - loose.alpha_low > tight.alpha_high - tight.alpha_low


@settings(max_examples=30, deadline=None)
@given(scale=st.floats(1e-3, 1e3), unit=st.floats(1e-3, 1e3), alpha=st.floats(-1, 1), seed=st.integers(0, 99))
def test_alpha_does_not_depend_on_the_units_of_n_or_of_the_gap(scale, unit, alpha, seed):
    gaps = _gaps(alpha, 1.0, 0.1, seed=seed)
    base, _ = fit_power(NS, gaps, draws=100)
    gaps_scaled, _ = fit_power(NS, [[g * scale for g in gs] for gs in gaps], draws=100)
    n_scaled, _ = fit_power([n * unit for n in NS], gaps, draws=100)
    for other in (gaps_scaled, n_scaled):
        assert other.alpha == pytest.approx(base.alpha, abs=1e-9)
        assert other.alpha_low == pytest.approx(base.alpha_low, abs=1e-9)
        assert other.alpha_high == pytest.approx(base.alpha_high, abs=1e-9)
    assert gaps_scaled.a == pytest.approx(base.a * scale, rel=1e-9)
    assert n_scaled.a == pytest.approx(base.a * unit ** base.alpha, rel=1e-9)


@pytest.mark.parametrize("ns, gaps, says", [
    ([1e4], [[0.1, 0.2]], "two shapes"),
    ([1e4, 1e5], [[0.1], [0.05, 0.06]], "two seeds"),
    ([1e4, 1e4], [[0.1, 0.2], [0.1, 0.2]], "same non-embedding"),
    ([1e4, 1e5], [[0.1, 0.1], [0.05, 0.06]], "do not vary"),
    ([1e4, 1e5], [[0.1, 0.12], [-0.01, 0.02]], "cross zero"),
    ([1e4, 1e5], [[0.1, 0.12], [-0.01, -0.02]], "cross zero"),
])
def test_no_power_law_is_forced(ns, gaps, says):
    assert says in no_fit_reason(ns, gaps)
    fit, boot = fit_power(ns, gaps, variant="share_qk")
    assert fit.alpha is None and fit.a is None and says in fit.reason and boot.shape == (0, 2)
    assert fit.row()["variant"] == "share_qk"


def test_two_shapes_fit_exactly_with_no_residual():
    fit, _ = fit_power([1e4, 1e5], [[0.10, 0.12], [0.05, 0.06]], draws=100)
    assert fit.residual is None and fit.alpha == pytest.approx(-math.log10(0.055 / 0.11))


def test_the_misfit_is_the_residual_squared_times_its_degrees_of_freedom():
    gaps = _gaps(0.3, 2.0, 0.1, seed=3)
    fit, _ = fit_power(NS, gaps, draws=50)
    x = np.log(NS)
    assert misfit(x, [np.asarray(g) for g in gaps]) == pytest.approx(fit.residual ** 2 * (len(NS) - 2), rel=1e-12)


def _lack_of_fit_by_hand(ns, gaps, draws, seed=0):
    """The parametric bootstrap written out with plain loops (the dense reference)."""
    x = [math.log(n) for n in ns]

    def stat(gs):
        means = [sum(g) / len(g) for g in gs]
        ses = [math.sqrt(sum((v - m) ** 2 for v in g) / (len(g) - 1) / len(g)) for g, m in zip(gs, means, strict=True)]
        if min(means) <= 0 or min(ses) <= 0:
            return None
        w = [(m / s) ** 2 for m, s in zip(means, ses, strict=True)]
        y = [math.log(m) for m in means]
        sw = sum(w)
        mx, my = sum(a * b for a, b in zip(w, x, strict=True)) / sw, sum(a * b for a, b in zip(w, y, strict=True)) / sw
        b = sum(wi * (xi - mx) * (yi - my) for wi, xi, yi in zip(w, x, y, strict=True)) / sum(
            wi * (xi - mx) ** 2 for wi, xi in zip(w, x, strict=True))
        c = my - b * mx
        return sum(wi * (yi - c - b * xi) ** 2 for wi, xi, yi in zip(w, x, y, strict=True)), c, b

    observed, c, b = stat(gaps)
    rng = np.random.default_rng([seed, 1])
    sds = [math.sqrt(sum((v - sum(g) / len(g)) ** 2 for v in g) / (len(g) - 1)) for g in gaps]
    beyond = kept = 0
    for _ in range(draws):
        drawn = [list(rng.normal(math.exp(c + b * xi), sd, len(g))) for xi, sd, g in zip(x, sds, gaps, strict=True)]
        s = stat(drawn)
        if s is None:
            continue
        kept += 1
        beyond += s[0] >= observed
    return (1 + beyond) / (1 + kept)


def test_the_lack_of_fit_p_is_the_bootstrap_written_out():
    for seed in range(3):
        gaps = _gaps(0.3, 2.0, 0.2, seed=seed)
        fit, _ = fit_power(NS, gaps, draws=200)
        assert fit.p_fit == pytest.approx(_lack_of_fit_by_hand(NS, gaps, 200), abs=1e-12)


def test_a_true_power_law_is_rejected_about_as_often_as_the_level_says():
    """Calibration: ladders drawn from a power law with three seeds a rung are rejected at 1 - LEVEL (10 %) about
    10 % of the time (a chi-square test with the seeds' standard errors would reject far more often)."""
    rejected = sum(not fit_power(NS, _gaps(0.3, 2.0, 0.15, seed=s), draws=200)[0].describes for s in range(120))
    assert 3 <= rejected <= 24  # 10 % of 120 is 12; a binomial's 99.9 % range is about 3-24


def test_a_gap_that_rises_and_falls_is_not_a_power_law():
    """The CPU ladder's pattern (docs/twin.md): a tiny cost at the smallest shape, then larger and falling."""
    ns = [2088, 6736, 13944, 26784]
    gaps = [[0.004, 0.005, 0.006], [0.060, 0.070, 0.078], [0.055, 0.064, 0.072], [0.056, 0.059, 0.063]]
    fit, _ = fit_power(ns, gaps, draws=500)
    assert fit.alpha is not None and fit.p_fit < 0.01 and fit.describes is False
    assert fit_power(ns[1:], gaps[1:], draws=500)[0].describes


@settings(max_examples=20, deadline=None)
@given(st.floats(0.01, 100.0), st.floats(0.01, 100.0), st.integers(0, 50))
def test_the_lack_of_fit_p_does_not_depend_on_units(scale, unit, seed):
    gaps = _gaps(0.3, 2.0, 0.2, seed=seed)
    base, _ = fit_power(NS, gaps, draws=100)
    moved, _ = fit_power([n * unit for n in NS], [[g * scale for g in r] for r in gaps], draws=100)
    assert moved.p_fit == pytest.approx(base.p_fit, abs=0.02)  # the same draws up to rounding at the boundary
