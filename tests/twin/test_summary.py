"""The paired comparison: the t-interval and the one-sided tests against scipy's, and their identities."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from qkinspect.twin.summary import compare, steps_to

diffs = st.lists(st.floats(-1, 1, allow_nan=False, allow_infinity=False), min_size=2, max_size=8).filter(
    lambda d: max(d) - min(d) > 1e-6)


@settings(max_examples=60, deadline=None)
@given(diffs, st.floats(0, 0.5))
def test_interval_and_tests_are_scipys(d, margin):
    got = compare(d, margin)
    ci = stats.ttest_1samp(d, 0.0).confidence_interval(0.95)
    assert (got.ci_low, got.ci_high) == pytest.approx((ci.low, ci.high), abs=1e-9)
    assert got.p_not_worse == pytest.approx(stats.ttest_1samp(d, margin, alternative="less").pvalue, abs=1e-9)
    assert got.p_better == pytest.approx(stats.ttest_1samp(d, -margin, alternative="less").pvalue, abs=1e-9)
    assert got.p_worse == pytest.approx(stats.ttest_1samp(d, margin, alternative="greater").pvalue, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(diffs, st.floats(0, 0.5))
def test_identities(d, margin):
    got = compare(d, margin)
    assert got.ci_low <= got.diff <= got.ci_high
    assert got.p_not_worse + got.p_worse == pytest.approx(1.0)  # the same statistic, two sides
    assert got.p_better >= got.p_not_worse - 1e-12  # below −m is a stronger claim than below +m
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


def test_steps_to_standard():
    assert steps_to({0: 5.0, 10: 3.0, 20: 2.0}, 3.0) == 10
    assert steps_to({0: 5.0, 10: 4.0}, 3.0) is None
    assert steps_to({0: 5.0}, None) is None
