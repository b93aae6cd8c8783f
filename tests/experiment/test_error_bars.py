"""Error bars of exact runs: the block standard error against a dense reference, its identities, and the ratio
to ablate judged against the ablation's error."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkinspect.experiment.model.scoring import BLOCK, block_se, token_blocks
from qkinspect.experiment.results import Run
from qkinspect.experiment.run import _with_ratios


def _reference_se(diff: list[float], blocks: list[int]) -> float:
    """Cluster-robust SE of a ratio estimator, by hand over a dict of blocks."""
    groups: dict[int, list[float]] = {}
    for d, b in zip(diff, blocks, strict=True):
        groups.setdefault(b, []).append(d)
    J = len(groups)
    mean = sum(diff) / len(diff)
    ss = sum((sum(v) - mean * len(v)) ** 2 for v in groups.values())
    return math.sqrt(J / (J - 1) * ss) / len(diff)


def test_block_se_equals_the_reference_and_the_iid_se_with_one_token_blocks():
    g = torch.Generator().manual_seed(0)
    diff = torch.randn(300, generator=g, dtype=torch.float64)
    blocks = torch.randint(0, 17, (300,), generator=g)
    assert block_se(diff, blocks) == pytest.approx(_reference_se(diff.tolist(), blocks.tolist()), rel=1e-12)
    iid = float(diff.std(unbiased=True)) / math.sqrt(300)  # one token per block: the usual standard error
    assert block_se(diff, torch.arange(300)) == pytest.approx(iid, rel=1e-12)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=2, max_size=40), st.floats(-3, 3), st.floats(0.1, 10),
       st.integers(1, 6))
def test_block_se_identities(values, shift, scale, n_blocks):
    diff = torch.tensor(values, dtype=torch.float64)
    blocks = torch.arange(len(values)) % n_blocks
    se = block_se(diff, blocks)
    if min(n_blocks, len(values)) < 2:
        assert se is None
        return
    assert se >= 0
    # a constant shift of every difference leaves the error unchanged; a scale scales it
    assert block_se(diff + shift, blocks) == pytest.approx(se, rel=1e-9, abs=1e-12)
    assert block_se(diff * scale, blocks) == pytest.approx(se * scale, rel=1e-9, abs=1e-12)


def test_token_blocks_number_blocks_within_each_window():
    scored = torch.ones(2, BLOCK + 3, dtype=torch.bool)
    scored[1, 0] = False
    ids = token_blocks(scored)
    assert ids.tolist() == [0] * BLOCK + [1] * 3 + [2] * (BLOCK - 1) + [3] * 3


def _run(edit, dloss, se):
    return Run(edit=edit, scope="head", layer=0, head=0, heads=1, loss=1 + dloss, dloss=dloss, ratio=None,
               predicted=None, offset0=False, seconds=0.0, forward_seconds=0.0, dloss_se=se)


@pytest.mark.parametrize("ablate,se,expected", [(0.5, 0.01, 0.2), (-0.3, 0.01, None), (0.01, 0.01, None),
                                                 (0.03, 0.01, 0.1 / 0.03 * 1.0), (0.5, None, None)])
def test_the_ratio_is_a_number_only_against_an_ablation_beyond_its_error(ablate, se, expected):
    share, abl = _with_ratios([_run("share_qk", 0.1, 0.01), _run("ablate", ablate, se)])
    assert share.ratio == (None if expected is None else pytest.approx(expected))
    assert abl.ratio == (None if expected is None else pytest.approx(1.0))
