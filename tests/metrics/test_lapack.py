"""MKL's potrf/trsm called directly (qkinspect.metrics.lapack) against torch's batched functions, the fallbacks, and the
factorisation identities as properties."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkinspect.metrics import lapack

direct = pytest.mark.skipif(not lapack.available(), reason="torch's CPU library does not export MKL's potrf/trsm here")


def _grams(n: int, rows: int, d: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, rows, d, generator=g, dtype=torch.float64)
    return (X.mT @ X).to(dtype)


@direct
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.float64, 1e-13)])
def test_cholesky_equals_torch_and_flags_the_same_heads(dtype, tol):
    G = _grams(32, 4096, 128, dtype)
    G[5, 40, 40] = -1.0  # not positive definite from order 41
    L, info = lapack.cholesky_ex(G)
    want, want_info = torch.linalg.cholesky_ex(G)
    assert info.tolist() == want_info.tolist() and int(info[5]) == 41 and int(info.count_nonzero()) == 1
    ok = info == 0
    scale = want[ok].abs().amax()
    assert float((L[ok] - want[ok]).abs().max()) <= tol * float(scale)
    assert torch.equal(L[ok], L[ok].tril())


@direct
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_triangular_inverse_equals_torch(dtype, tol):
    L = torch.linalg.cholesky(_grams(32, 4096, 128, dtype, seed=1))
    got = lapack.inverse_lower(L)
    want = torch.linalg.inv(L)
    assert float((got - want).abs().max()) <= tol * float(want.abs().max())


@direct
def test_only_the_lower_triangle_is_read():
    G = _grams(4, 50, 16, torch.float64)
    L = torch.linalg.cholesky(G)
    noisy = G.tril() + torch.full_like(G, 7.0).triu(1)  # garbage above the diagonal
    assert torch.allclose(lapack.cholesky_ex(noisy)[0], L, rtol=1e-12, atol=1e-12)
    assert torch.allclose(lapack.inverse_lower(L + L.mT.triu(1) * 3), torch.linalg.inv(L), rtol=1e-10, atol=1e-12)


def test_views_and_other_inputs_give_the_same_answers():
    G = _grams(6, 30, 8, torch.float64)
    L = torch.linalg.cholesky(G)
    assert torch.allclose(lapack.cholesky_ex(G.mT)[0], L, rtol=1e-12)  # a transposed view (G symmetric)
    assert torch.allclose(lapack.inverse_lower(L.mT.contiguous().mT), torch.linalg.inv(L), rtol=1e-10)  # column-major
    assert lapack.cholesky_ex(G[:0])[0].shape == (0, 8, 8)  # an empty batch: torch's function
    half = G.to(torch.float32)[:2]
    assert torch.allclose(lapack.cholesky_ex(half)[0], torch.linalg.cholesky(half), rtol=1e-5, atol=1e-5)


def test_without_the_routines_torch_runs(monkeypatch):
    monkeypatch.setattr(lapack, "_find", lambda symbol: None)
    lapack._routine.cache_clear()
    try:
        assert not lapack.available()
        G = _grams(3, 20, 5, torch.float64)
        L, info = lapack.cholesky_ex(G)
        assert torch.allclose(L, torch.linalg.cholesky(G)) and info.tolist() == [0, 0, 0]
        assert torch.allclose(lapack.inverse_lower(L), torch.linalg.inv(L))
    finally:
        lapack._routine.cache_clear()


def test_a_wrong_routine_is_not_used(monkeypatch):
    """A symbol that does not do what the self-test expects (here: a routine that does nothing) is refused."""
    real = lapack._find

    def useless(symbol):
        fn = real(symbol)
        return None if fn is None else (lambda *args: None)

    monkeypatch.setattr(lapack, "_find", useless)
    lapack._routine.cache_clear()
    try:
        assert lapack._routine(torch.float64, "potrf") is None
        assert lapack._routine(torch.float32, "trsm") is None
    finally:
        lapack._routine.cache_clear()


def test_lp64_integers_read_back():
    assert lapack._int(0) == 0 and lapack._int(41) == 41
    assert lapack._int((1 << 32) - 3) == -3  # a 32-bit -3 in the low half of a 64-bit zero
    assert lapack._int(-3) == -3  # a 64-bit interface's -3


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 5), d=st.integers(1, 24), extra=st.integers(0, 20), seed=st.integers(0, 2**31 - 1),
       double=st.booleans())
def test_factor_and_inverse_identities(n, d, extra, seed, double):
    dtype = torch.float64 if double else torch.float32
    G = _grams(n, d + extra + 1, d, dtype, seed) + torch.eye(d, dtype=dtype)  # safely positive definite
    L, info = lapack.cholesky_ex(G)
    tol = 1e-10 if double else 2e-4
    assert info.tolist() == [0] * n
    assert torch.equal(L, L.tril())
    assert torch.allclose(L @ L.mT, G, rtol=tol, atol=tol * float(G.abs().max()))
    eye = torch.eye(d, dtype=dtype).expand(n, d, d)
    assert torch.allclose(lapack.inverse_lower(L) @ L, eye, rtol=tol, atol=tol * 10)
