"""Cholesky factors and triangular inverses of batches of small matrices, by MKL's LAPACK called directly.

torch's batched wrappers cost as much again as the work for the d_head x d_head matrices here: for 32 Grams of
128 x 128 (a 7B layer), `torch.linalg.cholesky_ex` took 5.7-6.4 ms and 32 calls of `spotrf` 3.3-4.5 ms; the
triangular inverses, `torch.linalg.solve_triangular` against the identity 9.5-9.8 ms and 32 calls of `strsm`
5.1 ms (one thread, AMD EPYC). The routines are MKL's own, which torch's CPU library carries and exports (as it
does `cblas_gemm_bf16bf16f32`, see `backend`; both are found by `torchlib`); each is checked once against torch on
a small batch, and where a symbol is missing, the check fails, or the input is not a float32/float64 CPU tensor,
torch's function runs instead.

Example:
    >>> X = torch.randn(3, 40, 8, dtype=torch.float64)
    >>> L, info = cholesky_ex(X.mT @ X)
    >>> torch.allclose(L @ L.mT, X.mT @ X), info.tolist()
    (True, [0, 0, 0])
    >>> torch.allclose(inverse_lower(L) @ L, torch.eye(8, dtype=torch.float64).expand(3, 8, 8))
    True
"""

from __future__ import annotations

import ctypes
from functools import cache

import torch
from torch import Tensor

from qkinspect.metrics.torchlib import torch_symbol

_PREFIX = {torch.float32: "s", torch.float64: "d"}


def cholesky_ex(G: Tensor) -> tuple[Tensor, Tensor]:
    """(L, info) for a batch of symmetric matrices G (n, d, d), as `torch.linalg.cholesky_ex`: L lower triangular
    with G = L Lᵀ where info == 0; info > 0 where the leading minor of that order is not positive definite (the
    rest of that L is then unspecified). Reads only G's lower triangle."""
    potrf = _routine(G.dtype, "potrf") if _direct(G) else None
    return torch.linalg.cholesky_ex(G) if potrf is None else _potrf(potrf, G)


def inverse_lower(L: Tensor) -> Tensor:
    """L⁻¹ for a batch of lower-triangular matrices L (n, d, d) with nonzero diagonals (upper triangles ignored)."""
    trsm = _routine(L.dtype, "trsm") if _direct(L) else None
    if trsm is None:
        eye = torch.eye(L.shape[-1], dtype=L.dtype, device=L.device).expand_as(L)
        return torch.linalg.solve_triangular(L, eye, upper=False)
    return _trsm(trsm, L)


def _potrf(potrf, G: Tensor) -> tuple[Tensor, Tensor]:
    """`cholesky_ex` by `potrf`, one matrix at a time. Row-major memory read as column-major is the transpose:
    LAPACK's upper factor U of G (G = UᵀU, from its column-major upper triangle, our lower one) reads back as
    L = Uᵀ, lower, with G = L Lᵀ."""
    n, d = G.shape[0], G.shape[-1]
    L = G.clone(memory_format=torch.contiguous_format)
    info = torch.zeros(n, dtype=torch.int64)
    size, uplo, step = ctypes.c_int64(d), ctypes.c_char(b"U"), d * d * L.element_size()
    out = ctypes.c_int64(0)
    for i in range(n):
        out.value = 0
        potrf(ctypes.byref(uplo), ctypes.byref(size), ctypes.c_void_p(L.data_ptr() + i * step), ctypes.byref(size),
              ctypes.byref(out))
        info[i] = _int(out.value)
    return L.tril_(), info


def _trsm(trsm, L: Tensor) -> Tensor:
    """`inverse_lower` by `trsm`, one matrix at a time: row-major L X = I is column-major Xᵀ Lᵀ = I, solved as
    B A = I from the right with A = Lᵀ upper and B = Xᵀ in memory."""
    n, d = L.shape[0], L.shape[-1]
    L = L.contiguous()
    out = torch.eye(d, dtype=L.dtype).expand(n, d, d).contiguous()
    side, uplo, trans, diag = (ctypes.c_char(c) for c in (b"R", b"U", b"N", b"N"))
    size, step = ctypes.c_int64(d), d * d * L.element_size()
    one = (ctypes.c_float if L.dtype == torch.float32 else ctypes.c_double)(1.0)
    for i in range(n):
        trsm(ctypes.byref(side), ctypes.byref(uplo), ctypes.byref(trans), ctypes.byref(diag), ctypes.byref(size),
             ctypes.byref(size), ctypes.byref(one), ctypes.c_void_p(L.data_ptr() + i * step), ctypes.byref(size),
             ctypes.c_void_p(out.data_ptr() + i * step), ctypes.byref(size))
    return out


def available() -> bool:
    """Whether both routines run directly here (in float32 and float64)."""
    return all(_routine(t, r) is not None for t in _PREFIX for r in ("potrf", "trsm"))


def _direct(A: Tensor) -> bool:
    return A.device.type == "cpu" and A.dtype in _PREFIX and A.dim() == 3 and A.shape[0] > 0 and A.shape[-1] > 0


def _int(v: int) -> int:
    """LAPACK's INTEGER written into a signed 64-bit zero: MKL's 64-bit interface writes all of it, its 32-bit
    (LP64) one the low half only, so a negative value shows there as 2³² minus its magnitude."""
    return v - (1 << 32) if v >= 1 << 31 else v


@cache
def _routine(dtype: torch.dtype, name: str):
    """MKL's LAPACK/BLAS routine `name` for `dtype` from torch's CPU library, if exported and correct here."""
    fn = _find(_PREFIX[dtype] + name + "_")
    if fn is None:
        return None
    try:
        ok = _SELF_TESTS[name](dtype, fn)
    except (OSError, RuntimeError, ValueError):
        ok = False
    return fn if ok else None


def _find(symbol: str):
    fn = torch_symbol(symbol)
    if fn is not None:
        fn.restype = None  # Fortran subroutines; every argument by reference (INTEGER: 64-bit zeros, see `_int`)
    return fn


def _test_matrices(dtype: torch.dtype) -> Tensor:
    g = torch.Generator().manual_seed(0)
    X = torch.randn(3, 19, 7, generator=g, dtype=torch.float64)
    return (X.mT @ X).to(dtype)


def _potrf_ok(dtype: torch.dtype, fn) -> bool:
    G = _test_matrices(dtype)
    G[2, 3, 3] = -1.0  # not positive definite from order 4
    L, info = _potrf(fn, G)
    want, want_info = torch.linalg.cholesky_ex(G)
    rtol = 1e-5 if dtype == torch.float32 else 1e-12
    return info.tolist() == want_info.tolist() == [0, 0, 4] and torch.allclose(L[:2], want[:2], rtol=rtol, atol=rtol)


def _trsm_ok(dtype: torch.dtype, fn) -> bool:
    L = torch.linalg.cholesky(_test_matrices(dtype))
    want = torch.linalg.inv(L)
    rtol = 1e-4 if dtype == torch.float32 else 1e-10
    return torch.allclose(_trsm(fn, L), want, rtol=rtol, atol=rtol * float(want.abs().max()))


_SELF_TESTS = {"potrf": _potrf_ok, "trsm": _trsm_ok}
