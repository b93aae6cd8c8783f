"""The ladder's scaling fit (qkinspect.twin.scaling): the weighted log-log line against numpy's, a known exponent
recovered with an interval that holds it, the exponent unchanged by a unit of N or of the gap, and the rungs it
refuses to force a power law on."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qkinspect.twin.scaling import band, fit_power, no_fit_reason, weighted_line

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
