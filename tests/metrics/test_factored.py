"""Gram factors: the Cholesky fast path and the eigh fallback give the same factors, the fallback is per head, and a
factor's finiteness is read from its Gram."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

import qkinspect.metrics.factored as factored
from qkinspect.metrics.factored import GramFactor
from qkinspect.metrics.heads import measure_heads
from qkinspect.metrics.products import HeadProducts
from qkinspect.metrics.similarity import subspace_overlap
from tests.metrics.helpers import make_layer


def _heads(seed: int, n: int, rows: int, d: int, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, rows, d, generator=g, dtype=dtype)


def _mixed(dtype=torch.float32) -> torch.Tensor:
    """Four heads: well conditioned, rank-deficient, zero, and full rank but below the Cholesky margin."""
    X = _heads(0, 4, 256, 8, dtype)
    X[1, :, 5:] = X[1, :, :3]  # rank 5
    X[2] = 0
    X[3] = X[3] * torch.logspace(0, -2, 8, dtype=dtype)  # σ spread 100x: λ spread 1e4, above float32's margin
    return X


def _factor(X: torch.Tensor) -> GramFactor:
    return GramFactor(X.mT @ X, rows=X.shape[-2])


def test_fast_path_is_per_head():
    f = _factor(_mixed())
    _, _, safe, _ = f._spectrum
    assert safe.tolist() == [True, False, False, False]
    assert f.rank.tolist() == [8, 5, 0, 8]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cholesky_and_eigh_factors_agree(monkeypatch, dtype):
    X = _mixed(dtype)
    fast = _factor(X)
    monkeypatch.setattr(factored, "SAFE", float("inf"))  # every head takes the eigendecomposition
    slow = _factor(X)
    assert not slow._spectrum[2].any()
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-12}
    torch.testing.assert_close(fast.sigma, slow.sigma, **tol)
    assert torch.equal(fast.rank, slow.rank)
    for f in (fast, slow):
        torch.testing.assert_close(f.root.mT @ f.root, f.gram, rtol=1e-4 if dtype == torch.float32 else 1e-10,
                                   atol=1e-3 if dtype == torch.float32 else 1e-9)
    # Roots differ by an orthogonal factor, whiteners by its transpose: the subspace they describe is the same.
    Y = _heads(1, 4, 256, 8, dtype)
    fy = _factor(Y)
    want = subspace_overlap(slow, fy, Y.mT @ X)
    torch.testing.assert_close(subspace_overlap(fast, fy, Y.mT @ X), want, **tol, equal_nan=True)


def test_whitener_orthonormalises_on_the_fast_path():
    X = _heads(2, 3, 64, 6)
    f = _factor(X)
    assert f._spectrum[2].all()
    U = X @ f.whitener  # (3, 64, 6)
    torch.testing.assert_close(U.mT @ U, torch.eye(6, dtype=X.dtype).expand(3, 6, 6), rtol=0, atol=1e-12)


def test_a_batch_equals_its_heads_alone():
    X = _mixed()
    batch = _factor(X)
    for i in range(X.shape[0]):
        alone = _factor(X[i : i + 1])
        torch.testing.assert_close(batch.sigma[i : i + 1], alone.sigma)
        assert torch.equal(batch.rank[i : i + 1], alone.rank)


def test_indexed_factors_decompose_once():
    X = _heads(3, 2, 32, 4)
    f = _factor(X)
    g = f.index(torch.tensor([0, 0, 1, 1]))
    assert torch.equal(g.sigma, f.sigma[[0, 0, 1, 1]]) and torch.equal(g.whitener, f.whitener[[0, 0, 1, 1]])
    assert "_spectrum" not in vars(g)  # the indexed view reuses the parent's decomposition


def test_non_finite_kv_head_flags_its_whole_group():
    layer = make_layer(7, H=4, G=2, D=12, d=3)
    K = layer.W_K.clone()
    K[1, 4, 2] = float("inf")
    values, _, warnings = measure_heads(replace(layer, W_K=K), ["symmetry", "overlap_kv", "norm_q_fro"])
    assert np.isfinite(values["symmetry"][:2]).all() and np.isnan(values["symmetry"][2:]).all()
    assert np.isnan(values["norm_q_fro"][2:]).all()  # every metric of a bad head is NaN
    assert [w.split(":")[0] for w in warnings] == ["encoder layer 0 head 2", "encoder layer 0 head 3"]


def test_overflowing_head_is_flagged_not_decomposed():
    """Entries too large for float32's squares: the Gram overflows, so the head is NaN, not a LAPACK error."""
    layer = make_layer(8, H=2, G=2, D=12, d=3, dtype=torch.float32)
    Q = layer.W_Q.clone()
    Q[0] *= 1e25
    values, _, warnings = measure_heads(replace(layer, W_Q=Q), ["symmetry", "qk_effective_rank"], dtype=torch.float32)
    assert np.isnan(values["symmetry"][0]) and np.isfinite(values["symmetry"][1])
    assert "head 0: non-finite" in warnings[0]


def test_non_finite_w_o_only_touches_the_ov_metrics():
    layer = make_layer(9, H=2, G=1, D=10, d=3)
    O = layer.W_O.clone()
    O[1, 0, 0] = float("nan")
    p = HeadProducts(replace(layer, W_O=O), dtype=torch.float64)
    assert p.bad.tolist() == [False, False] and p.bad_ov.tolist() == [False, True]
    values, _, _ = measure_heads(replace(layer, W_O=O), ["symmetry", "ov_effective_rank"])
    assert np.isfinite(values["symmetry"]).all() and np.isnan(values["ov_effective_rank"]).tolist() == [False, True]
