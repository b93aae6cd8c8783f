"""Identities of the factored SVD and of the subspace blocks (metrics.directions), as hypothesis properties."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qkinspect.metrics.directions import GAP, canonical_signs, continues, factored_svd, subspaces, token_scores

SETTINGS = dict(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def factors(seed: int, n: int, D: int, d: int):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, D, d, generator=g, dtype=torch.float64),
            torch.randn(n, D, d, generator=g, dtype=torch.float64))


@settings(**SETTINGS)
@given(seed=st.integers(0, 2**16), n=st.integers(1, 3), d=st.integers(1, 8), extra=st.integers(0, 20))
def test_the_factored_svd_reconstructs_the_form_with_orthonormal_canonical_vectors(seed, n, d, extra):
    A, B = factors(seed, n, d + extra, d)
    U, S, V = factored_svd(A, B)
    eye = torch.eye(d, dtype=torch.float64).expand(n, d, d)
    assert torch.allclose(U @ torch.diag_embed(S) @ V.mT, A @ B.mT, atol=1e-9 * float(S.max()))
    assert torch.allclose(U.mT @ U, eye, atol=1e-9) and torch.allclose(V.mT @ V, eye, atol=1e-9)
    assert (S[:, :-1] >= S[:, 1:]).all()
    assert (V.gather(-2, V.abs().argmax(-2, keepdim=True)) > 0).all()


@settings(**SETTINGS)
@given(seed=st.integers(0, 2**16), d=st.integers(1, 6), extra=st.integers(1, 20))
def test_directions_are_gauge_invariant(seed, d, extra):
    """W_Q → W_Q G, W_K → W_K G⁻ᵀ leaves W_QK, so its singular values and (canonical) vectors, unchanged."""
    A, B = factors(seed, 1, d + extra, d)
    g = torch.Generator().manual_seed(seed + 1)
    G = torch.randn(d, d, generator=g, dtype=torch.float64) + 3 * torch.eye(d, dtype=torch.float64)
    U1, S1, V1 = factored_svd(A, B)
    U2, S2, V2 = factored_svd(A @ G, B @ torch.linalg.inv(G).T)
    assert torch.allclose(S1, S2, rtol=1e-7, atol=1e-9 * float(S1.max()))
    gaps = S1[0, :-1] / S1[0, 1:]
    for i in range(d):  # vectors: only where σ_i stands apart from its neighbours
        if (i == 0 or gaps[i - 1] > 1.01) and (i == d - 1 or gaps[i] > 1.01):
            assert torch.allclose(V1[0, :, i], V2[0, :, i], atol=1e-6)
            assert torch.allclose(U1[0, :, i], U2[0, :, i], atol=1e-6)


@settings(**SETTINGS)
@given(s=st.lists(st.floats(0.01, 100.0), min_size=1, max_size=12), k=st.integers(1, 12))
def test_blocks_split_exactly_at_the_gap(s, k):
    S = torch.tensor(sorted(s, reverse=True), dtype=torch.float64)
    blocks = subspaces(S, k)
    flat = [i for b in blocks for i in b]
    assert flat == list(range(len(flat)))  # consecutive, from the top
    assert len(flat) >= min(k, len(s)) and len(flat) - len(blocks[-1]) < k  # reaches k; the last block is needed
    for b in blocks:
        assert all(S[i] < GAP * S[i + 1] for i in b[:-1])  # inside a block: within the gap
        if b[-1] + 1 < len(s) and not (b is blocks[-1] and continues(S, blocks)):
            assert S[b[-1]] >= GAP * S[b[-1] + 1]  # at its end: apart (unless cut K past K: `continues`)
    assert flat[-1] <= 2 * k - 1  # a run grows at most k past the k-th direction


@settings(**SETTINGS)
@given(seed=st.integers(0, 2**16), b=st.integers(1, 4))
def test_a_subspace_score_is_rotation_invariant(seed, b):
    """Any orthonormal basis of the span gives the same projection norms (why a subspace is read by them)."""
    g = torch.Generator().manual_seed(seed)
    T = torch.randn(30, 8, generator=g, dtype=torch.float64)
    W, _ = torch.linalg.qr(torch.randn(8, b, generator=g, dtype=torch.float64))
    R, _ = torch.linalg.qr(torch.randn(b, b, generator=g, dtype=torch.float64))
    block = [tuple(range(b))]
    assert torch.allclose(token_scores(T, W, block), token_scores(T, W @ R, block), atol=1e-12)
    U, V = canonical_signs(-W[None], W[None])
    assert torch.allclose(U, -V)  # a pair flips together


@settings(**SETTINGS)
@given(seed=st.integers(0, 2**16), chunk=st.integers(1, 40), n=st.integers(1, 6))
def test_chunked_best_tokens_are_those_of_one_pass(seed, chunk, n):
    from qkinspect.metrics.directions import best_tokens

    g = torch.Generator().manual_seed(seed)
    T = torch.randn(37, 8, generator=g, dtype=torch.float64)
    W, _ = torch.linalg.qr(torch.randn(8, 5, generator=g, dtype=torch.float64))
    blocks = [(0,), (1, 2), (3,), (4,)]
    scores = token_scores(T, W, blocks)
    (hv, hi), (lv, li) = best_tokens(T, W, blocks, n, chunk=chunk)
    assert torch.equal(hi, torch.topk(scores, n, dim=0).indices)
    assert torch.equal(li, torch.topk(-scores[:, [0, 2, 3]], n, dim=0).indices)
    assert torch.allclose(lv, torch.topk(-scores[:, [0, 2, 3]], n, dim=0).values)
