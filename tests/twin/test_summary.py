"""The paired comparison: the 90 % t-interval and the one-sided tests against scipy's, Holm's adjustment against
a hand computation, the gap's slope against numpy's least squares, and their identities (hypothesis)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from qkinspect.twin.summary import LEVEL, compare, corrected, gap_slope, holm, steps_to

diffs = st.lists(st.floats(-1, 1, allow_nan=False, allow_infinity=False), min_size=2, max_size=8).filter(
    lambda d: max(d) - min(d) > 1e-6)


@settings(max_examples=60, deadline=None)
@given(diffs, st.floats(0, 0.5))
def test_interval_and_tests_are_scipys(d, margin):
    got = compare(d, margin)
    assert LEVEL == pytest.approx(0.90)
    ci = stats.ttest_1samp(d, 0.0).confidence_interval(0.90)
    assert (got.ci_low, got.ci_high) == pytest.approx((ci.low, ci.high), abs=1e-9)
    assert got.p_one_sided_not_worse == pytest.approx(stats.ttest_1samp(d, margin, alternative="less").pvalue,
                                                      abs=1e-9)
    assert got.p_one_sided_better == pytest.approx(stats.ttest_1samp(d, -margin, alternative="less").pvalue,
                                                   abs=1e-9)
    assert got.p_one_sided_worse == pytest.approx(stats.ttest_1samp(d, margin, alternative="greater").pvalue,
                                                  abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(diffs, st.floats(0.001, 0.5))
def test_the_interval_shown_is_the_one_the_verdict_uses(d, margin):
    """Two one-sided tests at 5 % = the 90 % interval against ±margin: 'worse' exactly where the interval lies
    above +m, 'better' below −m, 'not worse' (or better) below +m."""
    got = compare(d, margin)
    tol = 1e-9
    if abs(got.ci_low - margin) > tol and abs(got.ci_high + margin) > tol and abs(got.ci_high - margin) > tol:
        assert (got.verdict == "worse") == (got.ci_low > margin)
        assert (got.verdict == "better") == (got.ci_high < -margin)
        assert (got.verdict in ("better", "not worse")) == (got.ci_high < margin)


@settings(max_examples=60, deadline=None)
@given(diffs, st.floats(0, 0.5))
def test_identities(d, margin):
    got = compare(d, margin)
    assert got.ci_low <= got.diff <= got.ci_high
    assert got.p_one_sided_not_worse + got.p_one_sided_worse == pytest.approx(1.0)  # one statistic, two sides
    assert got.p_one_sided_better >= got.p_one_sided_not_worse - 1e-12  # below −m is a stronger claim than +m
    shifted = compare([x + 0.3 for x in d], margin)  # shifting every difference shifts the interval
    assert shifted.ci_low == pytest.approx(got.ci_low + 0.3) and shifted.ci_high == pytest.approx(got.ci_high + 0.3)


def test_verdicts():
    assert compare([-0.10, -0.11, -0.12], 0.02).verdict == "better"
    assert compare([0.10, 0.11, 0.12], 0.02).verdict == "worse"
    assert compare([0.001, -0.002, 0.0005], 0.02).verdict == "not worse"
    assert compare([0.3, -0.3, 0.01], 0.02).verdict == "can't tell"
    assert compare([0.1], 0.02).verdict == "can't tell" and compare([0.1], 0.02).ci_low is None
    same = compare([0.5, 0.5, 0.5], 0.02)
    assert same.verdict == "worse" and same.ci_low == same.ci_high == 0.5
    assert math.isclose(compare([], 0.02).diff or 0.0, 0.0)


def _hand_holm(ps):
    """Holm (1979) written out: step down through the sorted p-values, reject while p_(j) ≤ α/(m − j + 1); the
    adjusted p-value is the smallest α at which each is rejected."""
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    adj = [0.0] * m
    for rank, i in enumerate(order):
        adj[i] = min(1.0, max((m - j) * ps[order[j]] for j in range(rank + 1)))
    return adj


def test_holm_against_a_hand_computation():
    ps = [0.01, 0.04, 0.03, 0.005]
    # sorted 0.005, 0.01, 0.03, 0.04 -> 4·0.005, 3·0.01, 2·0.03, 1·0.04 = 0.02, 0.03, 0.06, max(0.06, 0.04)
    assert holm(ps) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm(ps) == pytest.approx(_hand_holm(ps))
    assert holm([0.2, None, 0.01]) == [pytest.approx(0.2), None, pytest.approx(0.02)]  # None: not in the family
    assert holm([0.03]) == [0.03]  # one test: no adjustment


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=10))
def test_holm_adjusted_p_values_are_at_least_the_raw_ones_and_keep_their_order(ps):
    adj = holm(ps)
    assert adj == pytest.approx(_hand_holm(ps))
    assert all(a >= p - 1e-15 and a <= 1.0 for a, p in zip(adj, ps, strict=True))
    for i in range(len(ps)):
        for j in range(len(ps)):
            if ps[i] < ps[j]:
                assert adj[i] <= adj[j] + 1e-15  # monotone in the raw p-values' order


def test_holm_can_turn_a_verdict_into_cant_tell():
    """Three variants just worse at 5 % one by one: Holm keeps the clearest, the others go back to can't tell."""
    a, b = compare([0.10, 0.11, 0.12], 0.02), compare([0.04, 0.06, 0.08], 0.02)
    assert b.verdict == "worse" and 0.025 < b.p_one_sided_worse < 0.05
    got = corrected([a, b, b])
    assert [c.verdict for c in got] == ["worse", "can't tell", "can't tell"] and got[0].family == 3
    assert corrected([b])[0].verdict == "worse" and corrected([b])[0].p_holm_worse == b.p_one_sided_worse


def test_the_gaps_slope_is_least_squares_per_seed_then_its_t_interval():
    g = np.random.default_rng(0)
    steps = [0, 100, 200, 300, 400, 500, 600]
    seeds = [{k: 0.1 - 2e-4 * k + s * 1e-3 * g.normal() for k in steps} for s in range(4)]
    got = gap_slope(seeds)
    last = steps[-4:]  # the last four evaluations after step 0
    per = [1000 * np.polyfit(last, [c[k] for k in last], 1)[0] for c in seeds]
    ci = stats.ttest_1samp(per, 0.0).confidence_interval(0.90)
    assert got.start == 300 and got.slope == pytest.approx(np.mean(per))
    assert (got.low, got.high) == pytest.approx((ci.low, ci.high))
    one = gap_slope(seeds[:1])
    assert one.slope == pytest.approx(per[0]) and one.low is None
    assert gap_slope([{0: 0.1, 100: 0.2}]).slope is None  # one evaluation after step 0: no slope


def test_steps_to_standard():
    assert steps_to({0: 5.0, 10: 3.0, 20: 2.0}, 3.0) == 10
    assert steps_to({0: 5.0, 10: 4.0}, 3.0) is None
    assert steps_to({0: 5.0}, None) is None


def test_edge_notes_name_each_edge_its_rate_and_variants():
    from qkinspect.twin.summary import edge_notes

    assert edge_notes({"standard": 1e-3}, [1e-3]) == []  # one rate: no grid
    assert edge_notes({"standard": 1e-3, "share_qk": 3e-3}, [3e-4, 1e-3, 3e-3]) == [
        "learning rate 0.003, the largest tried, chosen for share_qk: the best may lie above the grid (widen it)"]
    lines = edge_notes({"a": 3e-4, "b": 3e-3, "c": 3e-3, "d": 3e-3}, [3e-4, 1e-3, 3e-3])
    assert lines[0].startswith("learning rate 0.0003, the smallest tried, chosen for a: the best may lie below")
    assert "chosen for b, c and d:" in lines[1]
