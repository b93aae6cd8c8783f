"""The estimate's spot check (qkinspect.experiment.spot): which windows and heads it runs, when it calls an estimate
far below the edit's cost (hypothesis), and, on a tiny model, that its Δloss is an exact run of the head's edit on
those windows, made for the chosen heads and for no other."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qkinspect.experiment import spot as spot_module
from qkinspect.experiment.edits.names import parse_edit
from qkinspect.experiment.estimate import estimate_heads
from qkinspect.experiment.exact import make_units, run_unit
from qkinspect.experiment.model.scoring import BLOCK, Scorer, default_text, windows
from qkinspect.experiment.results import SIGNIFICANT
from qkinspect.experiment.spot import spot_check, spot_rows, undershoots
from tests.experiment import tiny_models as tiny
from tests.experiment.test_run import opened


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300), st.integers(1, 2048), st.integers(0, 2**31 - 1))
def test_spot_rows(n, window, seed):
    rows = spot_rows(n, window, seed)
    k = len(rows)
    assert rows == sorted(set(rows)) and all(0 <= r < n for r in rows)
    assert spot_rows(n, window, seed) == rows
    # a quarter of the windows, or as few as hold two blocks (a standard error), or all of them
    assert k == n or (k >= n / spot_module.SPOT_SHARE and k * window >= 2 * BLOCK)
    assert k == max(1, math.ceil(n / spot_module.SPOT_SHARE)) or (k - 1) * window < 2 * BLOCK


values = st.floats(-5, 5, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(values, values, st.floats(1e-4, 2, allow_nan=False), st.floats(0, 3, allow_nan=False))
def test_undershoots(estimate, exact, se, more):
    got = undershoots(estimate, exact, se)
    assert got == (exact - estimate > SIGNIFICANT * se and exact > 2 * estimate)
    assert not undershoots(estimate, exact, None)  # no standard error: not judged
    if got:  # a larger exact cost is as far above the estimate
        assert undershoots(estimate, exact + more, se)
    if exact <= 2 * estimate or exact <= estimate + SIGNIFICANT * se:
        assert not got


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny.llama(tmp_path_factory.mktemp("spot") / "llama")


def test_candidates_are_each_edits_quarter_furthest_reaching():
    from qkinspect.experiment.estimate import HeadEstimate

    reach = [0.3, 0.9, 0.1, 0.5, 0.7, 0.2, 0.8]
    found = [HeadEstimate(layer=0, head=h, edit=e, first=0.0, curvature=0.0, se=0.0, moved=1.0,
                          reach=r + (e == "ablate") * (1 - 2 * r), unreliable=False, predicted=None, offset0=False)
             for h, r in enumerate(reach) for e in ("share_qk", "ablate")]
    got = [(x.edit, x.head) for x in spot_module.candidates(found)]
    # ⌈7 / 4⌉ = 2 per edit: share_qk's largest reach 0.9, 0.8; ablate's (1 − r) 0.9, 0.8 for r = 0.1, 0.2
    assert got == [("share_qk", 1), ("share_qk", 6), ("ablate", 2), ("ablate", 5)]


def test_spot_check_is_an_exact_run_on_its_windows(llama):
    hf, layers = opened(llama)
    ids = windows(hf, default_text(), 8 * 32, 32)  # 8 windows: the spot check runs on 4 (two blocks of 64)
    s = Scorer(hf, ids)
    s.baseline(cache={1, 2})
    edits = [parse_edit("share_qk"), parse_edit("ablate")]
    originals = {1: layers[1], 2: layers[2]}
    found = estimate_heads(s, originals, [0, 1, 2, 3], edits, probes=2)
    checked, tokens = spot_check(s, originals, found, edits, rotary="gauge", seed=3)
    rows = spot_rows(ids.shape[0], ids.shape[1], 3)
    assert len(rows) == 4 and tokens == 4 * 31  # a window of 32 scores 31 predictions
    ref = Scorer(hf, ids[rows])
    base = ref.baseline(cache={1, 2})
    assert [(x.layer, x.head, x.edit) for x in checked] == [(x.layer, x.head, x.edit) for x in found]
    chosen = {(x.layer, x.head, x.edit) for x in spot_module.candidates(found)}
    assert len(chosen) == 2 * 2  # a quarter of each edit's 8 heads
    for before, x in zip(found, checked, strict=True):
        assert (x.first, x.curvature, x.reach) == (before.first, before.curvature, before.reach)
        if (x.layer, x.head, x.edit) not in chosen:
            assert x.spot is None and x.spot_se is None and not x.unreliable
            continue
        (unit,) = make_units("head", [x.layer], [x.head])
        r = run_unit(ref, hf, originals, unit, parse_edit(x.edit), "head", base, "gauge")
        assert x.spot == r.dloss and x.spot_se == r.dloss_se
        assert x.unreliable == undershoots(x.estimate, r.dloss, r.dloss_se)


def test_nothing_to_check():
    assert spot_check(None, {}, [], [], rotary="gauge") == ([], 0)
