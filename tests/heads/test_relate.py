"""Spearman's ρ with its bootstrap interval and permutation p-value against scipy.stats.spearmanr (one group) and a
dense reference of the within-layer ρ (ranks within each layer, centred, pooled)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import rankdata, spearmanr

from qkinspect.heads.relate import relate


@settings(max_examples=40, deadline=None)
@given(n=st.integers(4, 40), seed=st.integers(0, 2**16), ties=st.booleans())
def test_one_group_is_spearmans_rho(n, seed, ties):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    y = x + rng.normal(size=n)
    if ties:
        x = np.round(x)
    r = relate(x, y, resamples=50, permutations=50, seed=seed)
    want = spearmanr(x, y).statistic
    if not np.isfinite(want):
        assert r.rho is None
        return
    assert r.rho == pytest.approx(want, abs=1e-12)
    assert -1 <= r.rho <= 1 and 0 < r.p <= 1 and r.n == n


def test_within_groups_is_the_pooled_correlation_of_centred_ranks():
    rng = np.random.default_rng(3)
    groups = np.repeat(np.arange(4), 6)
    x = rng.normal(size=24) + groups * 5  # depth moves both sides: over all heads ρ is high, within layers not
    y = rng.normal(size=24) + groups * 5
    rx = np.concatenate([rankdata(x[groups == g]) - 3.5 for g in range(4)])
    ry = np.concatenate([rankdata(y[groups == g]) - 3.5 for g in range(4)])
    want = (rx * ry).sum() / np.sqrt((rx * rx).sum() * (ry * ry).sum())
    r = relate(x, y, groups, resamples=200, permutations=200)
    assert r.rho == pytest.approx(want)
    assert relate(x, y).rho > 0.8 and abs(r.rho) < 0.6


def test_interval_and_p_value_follow_the_data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=200)
    strong = relate(x, x + 0.3 * rng.normal(size=200))
    none = relate(x, rng.normal(size=200))
    assert strong.low < strong.rho < strong.high and strong.low > 0.8 and strong.p == pytest.approx(1 / 1001)
    assert none.low < 0 < none.high and none.p > 0.01


def test_undefined_where_a_side_is_constant_or_too_few():
    assert relate([1, 2, 3, 4], [5, 5, 5, 5]).rho is None
    assert relate([1, 2], [2, 1]).rho is None
    r = relate([1.0, np.nan, 3, 4, 5], [1, 2, 3, 4, 6])
    assert r.n == 4 and r.rho == pytest.approx(1.0)


def test_fixed_seed_gives_the_same_interval():
    x, y = np.arange(30.0), np.sin(np.arange(30.0))
    assert relate(x, y, seed=5) == relate(x, y, seed=5)
