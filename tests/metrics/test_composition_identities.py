"""Identities of the composition scores (qkinspect.metrics.composition), and the null against Monte Carlo.

- scale: every score is unchanged when any of W_Q, W_K, W_V, W_O is multiplied by a positive number;
- gauge: W_Q -> W_Q G, W_K -> W_K G⁻ᵀ (G invertible) leaves W_QK, hence the q and k scores, unchanged; W_V -> W_V G,
  W_O -> G⁻¹ W_O leaves W_OV, hence every score, unchanged;
- the residual basis: x -> x U (U orthogonal) on the residual stream changes no score;
- swapping a later head's W_Q and W_K swaps its q and k scores (K-composition is Q-composition of W_QKᵀ);
- V-composition is Q-composition into a head whose W_Q W_Kᵀ is the later head's W_V W_O;
- 0 <= score <= 1;
- the null: for Gaussian factors E[score²] = 1/D exactly (docs/composition.md), and E[score] lies just below 1/√D.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkinspect.layer import AttentionLayer, BlockSpec
from qkinspect.metrics.composition import null_score, read_side, scores, write_side
from tests.metrics import composition_reference as ref


def layer(seed: int, H: int = 4, G: int = 2, D: int = 16, d: int = 4, dv: int = 5, i: int = 0) -> AttentionLayer:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    spec = BlockSpec("decoder", 2, H, G, D, d, d_head_v=dv)
    return AttentionLayer(spec, i, r(H, D, d), r(G, D, d), r(G, D, dv), r(H, dv, D))


def all_scores(a: AttentionLayer, b: AttentionLayer) -> dict[str, np.ndarray]:
    w, r = write_side(a, torch.float64), read_side(b, dtype=torch.float64)
    return {k: scores(w, r, k).numpy() for k in "qkv"}


def dense(a: AttentionLayer, b: AttentionLayer) -> dict[str, np.ndarray]:
    heads = lambda x: ref.heads_from([t.numpy() for t in x.W_Q], [t.numpy() for t in x.W_K],  # noqa: E731
                                     [t.numpy() for t in x.W_V], [t.numpy() for t in x.W_O])
    return ref.pair_scores(heads(a), heads(b))


def close(x: dict, y: dict, rtol: float = 1e-9) -> None:
    for k in x:
        np.testing.assert_allclose(x[k], y[k], rtol=rtol, err_msg=k)


seeds = st.integers(0, 2**31 - 1)


@settings(max_examples=15, deadline=None)
@given(seeds, st.integers(1, 3), st.integers(1, 2), st.integers(2, 6), st.integers(2, 6))
def test_factored_scores_equal_the_dense_definition(seed, rep, G, d, dv):
    H = rep * G
    a, b = layer(seed, H, G, 12, d, dv), layer(seed + 1, H, G, 12, d, dv)
    got = all_scores(a, b)
    close(got, dense(a, b))
    assert all(((v >= 0) & (v <= 1 + 1e-12)).all() for v in got.values())


@settings(max_examples=15, deadline=None)
@given(seeds, st.lists(st.floats(0.01, 100), min_size=4, max_size=4))
def test_scale_invariance(seed, c):
    a, b = layer(seed), layer(seed + 1)
    scaled = lambda x: replace(x, W_Q=c[0] * x.W_Q, W_K=c[1] * x.W_K, W_V=c[2] * x.W_V, W_O=c[3] * x.W_O)  # noqa: E731
    close(all_scores(scaled(a), scaled(b)), all_scores(a, b))


def invertible(seed: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, n, generator=g, dtype=torch.float64) + 3 * torch.eye(n, dtype=torch.float64)


@settings(max_examples=15, deadline=None)
@given(seeds)
def test_gauge_invariance(seed):
    a, b = layer(seed), layer(seed + 1)
    Gq, Gv = invertible(seed + 2, 4), invertible(seed + 3, 5)
    # per key/value head the same G for every query head reading it: W_Q G and W_K G⁻ᵀ keep W_Q W_Kᵀ
    gauged = lambda x: replace(x, W_Q=x.W_Q @ Gq, W_K=x.W_K @ torch.linalg.inv(Gq).T,  # noqa: E731
                               W_V=x.W_V @ Gv, W_O=torch.linalg.inv(Gv) @ x.W_O)
    close(all_scores(gauged(a), gauged(b)), all_scores(a, b), rtol=1e-8)


@settings(max_examples=15, deadline=None)
@given(seeds)
def test_residual_rotation_invariance(seed):
    a, b = layer(seed), layer(seed + 1)
    U = torch.linalg.qr(invertible(seed + 4, 16)).Q  # orthogonal (16, 16)
    rotated = lambda x: replace(x, W_Q=U.T @ x.W_Q, W_K=U.T @ x.W_K, W_V=U.T @ x.W_V, W_O=x.W_O @ U)  # noqa: E731
    close(all_scores(rotated(a), rotated(b)), all_scores(a, b), rtol=1e-8)


@settings(max_examples=15, deadline=None)
@given(seeds)
def test_swapping_queries_and_keys_swaps_q_and_k(seed):
    a, b = layer(seed, H=3, G=3), layer(seed + 1, H=3, G=3)
    swapped = replace(b, W_Q=b.W_K, W_K=b.W_Q)
    x, y = all_scores(a, b), all_scores(a, swapped)
    close({"q": x["q"], "k": x["k"], "v": x["v"]}, {"q": y["k"], "k": y["q"], "v": y["v"]})


def test_a_rank_deficient_head_is_scored_exactly():
    """A head whose W_V has rank 1 (its Gram is singular: no Cholesky factor) against the dense definition."""
    a, b = layer(7), layer(8)
    V = a.W_V.clone()
    V[0] = V[0, :, :1] @ torch.ones(1, 5, dtype=torch.float64)
    a = replace(a, W_V=V)
    close(all_scores(a, b), dense(a, b), rtol=1e-8)


@pytest.mark.parametrize("D,d,dv", [(24, 4, 6), (48, 8, 8), (16, 16, 2)])
def test_the_null_against_monte_carlo(D, d, dv):
    """Gaussian heads: the mean of score² is 1/D within 4 standard errors, every kind; the mean score lies between
    (1 - 3 Var(score²) D² / 8) / √D (docs/composition.md: E[s] = √m (1 - Var(s²)/(8 m²) + ...)) and 1/√D."""
    n = 400
    a = layer(1, n, n, D, d, dv)
    b = layer(2, n, n, D, d, dv)
    w, r = write_side(a, torch.float64), read_side(b, dtype=torch.float64)
    for kind in "qkv":
        s = torch.diagonal(scores(w, r, kind)).numpy()  # n independent pairs: head i of a into head i of b
        s2 = s**2
        se = s2.std(ddof=1) / np.sqrt(n)
        assert abs(s2.mean() - 1 / D) < 4 * se, (kind, s2.mean() * D, se * D)
        var = s2.var(ddof=1)
        assert null_score(D) * (1 - 3 * var * D**2 / 8) - 4 * s.std(ddof=1) / np.sqrt(n) < s.mean() \
            < null_score(D) + 1e-12 + 4 * s.std(ddof=1) / np.sqrt(n), kind


@settings(max_examples=15, deadline=None)
@given(seeds)
def test_v_composition_is_q_composition_with_w_ov_as_the_form(seed):
    """V-composition into b is Q-composition into a head whose form W_Q W_Kᵀ is b's W_V W_O (W_Q = W_V, W_K = W_Oᵀ):
    the three kinds are one definition applied to the matrix b reads with."""
    a, b = layer(seed, H=3, G=3, dv=4), layer(seed + 1, H=3, G=3, dv=4)
    as_form = replace(b, W_Q=b.W_V, W_K=b.W_O.mT)
    np.testing.assert_allclose(all_scores(a, b)["v"], all_scores(a, as_form)["q"], rtol=1e-9)
