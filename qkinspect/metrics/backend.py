"""The product backend: which routine computes the large per-head products, chosen once per process.

Checkpoints are mostly bf16, and bf16 -> float32 is exact, so a GEMM that reads bf16, accumulates in float32 and
writes float32 gives the float32 path's numbers without the cast. Torch has no such product on CPU (its bf16 `mm`
rounds the result to bf16), but its CPU library carries MKL, which exports `cblas_gemm_bf16bf16f32`. On a CPU with
AMX-BF16 it runs the products several times faster than float32; without AMX (AVX512-BF16 only, or older) MKL
emulates it, and there it is no faster than float32 in general, so it is chosen automatically only with AMX.

Routes (`route()`):
  "float32": torch's float32 products of the cast weights (the default, and the fallback everywhere);
  "bf16": MKL's bf16-in, float32-out GEMM, one call per head, reading bf16 weights directly.

The environment variable QKINSPECT_PRODUCTS overrides the choice: `auto` (default), `float32`, or `bf16` (forces
the MKL route wherever the symbol is present and passes its self-test, else an error). Only CPU tensors of bf16
use the bf16 route, and only in float32 runs: `--precision float64` and GPU runs never do.

Example:
    >>> X = torch.randn(2, 64, 8).bfloat16()
    >>> G = matmul(X.mT, X) if available() else X.float().mT @ X.float()  # (2, 8, 64) @ (2, 64, 8)
    >>> torch.equal(G, X.float().mT @ X.float()) or torch.allclose(G, X.float().mT @ X.float(), rtol=1e-6)
    True
"""

from __future__ import annotations

import ctypes
import os
from functools import cache
from pathlib import Path

import torch
from torch import Tensor

from qkinspect.errors import InputError
from qkinspect.metrics.torchlib import torch_symbol

ENV = "QKINSPECT_PRODUCTS"
_SYMBOL = "cblas_gemm_bf16bf16f32"
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112  # CBLAS enum values


@cache
def route() -> str:
    """The product route of this process: "bf16" or "float32" (see the module docstring), chosen on first call.

    Raises:
        InputError: QKINSPECT_PRODUCTS is not auto/float32/bf16, or is bf16 where the MKL routine is missing or
            fails its self-test.
    """
    want = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if want == "float32":
        return "float32"
    if want == "bf16":
        problem = _unavailable()
        if problem:
            raise InputError(f"{ENV}=bf16: the bf16 product route cannot run here: {problem}")
        return "bf16"
    if want != "auto":
        raise InputError(f"{ENV}={want!r}: choose auto, float32 or bf16")
    return best_route()


def best_route() -> str:
    """The fastest exact product route this machine has, as `route()` would choose it without an override
    ("bf16" only with AMX-BF16 and a working MKL routine; else "float32")."""
    return "bf16" if _has_amx_bf16() and not _unavailable() else "float32"


def uses_bf16(dtype: torch.dtype, device: str | torch.device) -> bool:
    """Whether products of bf16 weights at compute `dtype` on `device` take the bf16 route in this process."""
    return dtype == torch.float32 and torch.device(device).type == "cpu" and route() == "bf16"


def available() -> bool:
    """Whether the MKL bf16 routine is present here and passes its exactness self-test (whatever the CPU)."""
    return not _unavailable()


# -- selection ----------------------------------------------------------------------------------------------------

def _cpu_flags() -> set[str]:
    """The CPU feature flags the kernel reports (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def _has_amx_bf16() -> bool:
    """AMX-BF16 tiles (Sapphire Rapids and later): the only hardware measured where the bf16 route wins."""
    return "amx_bf16" in _cpu_flags()


def _find_gemm():
    """MKL's cblas_gemm_bf16bf16f32 from torch's CPU library, or None where it is absent."""
    fn = torch_symbol(_SYMBOL)
    if fn is None:
        return None
    # MKL_INT is 32 bits (LP64) or 64 (ILP64); 64-bit arguments work with both on x86-64 for values < 2³¹
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fn.argtypes = [ctypes.c_int] * 3 + [i64] * 3 + [ctypes.c_float, ptr, i64, ptr, i64, ctypes.c_float, ptr, i64]
    fn.restype = None
    return fn


@cache
def _gemm():
    return _find_gemm()


@cache
def _unavailable() -> str:
    """Why the bf16 route cannot run here ("" when it can): symbol missing, or the self-test failed."""
    if _gemm() is None:
        return f"torch's CPU library does not export {_SYMBOL}"
    try:
        ok = _self_test()
    except (OSError, RuntimeError, ValueError) as e:
        return f"{_SYMBOL} failed its self-test ({type(e).__name__}: {e})"
    return "" if ok else f"{_SYMBOL} is not exact here (self-test)"


def _self_test() -> bool:
    """Products of small integer-valued bf16 matrices, whose exact values (up to ~2e4) float32 holds and bf16
    does not, in each layout the metrics use (plain, transposed, strided heads), against float64."""
    g = torch.Generator().manual_seed(0)
    A = torch.randint(-16, 17, (3, 67, 37), generator=g).to(torch.bfloat16)  # (3, k, m)
    B = torch.randint(-16, 17, (3, 67, 29), generator=g).to(torch.bfloat16)  # (3, k, p)
    Ad, Bd = A.double(), B.double()
    checks = [
        (matmul(A.mT, B), Ad.mT @ Bd),  # Aᵀ B: transposed then plain
        (matmul(A.mT.contiguous(), B[:, :, :11].mT.contiguous().mT), Ad.mT @ Bd[:, :, :11]),  # strided columns
        (matmul(A[:, :, :29].mT, B[:2].mT.contiguous().mT, ia=torch.tensor([2, 0])), Ad[[2, 0], :, :29].mT @ Bd[:2]),
        (matmul(B.mT, A, out=torch.ones(3, 29, 37), accumulate=True), Bd.mT @ Ad + 1),
    ]
    return all(torch.equal(got.double(), want) for got, want in checks)


# -- products -----------------------------------------------------------------------------------------------------

def _layout(M: Tensor) -> tuple[int, int] | None:
    """(CBLAS transpose flag, leading dimension) of a 2-D view in row-major terms, or None if its strides are
    neither row- nor column-contiguous."""
    r, c = M.shape
    s0, s1 = M.stride()
    if s1 == 1 and (r == 1 or s0 >= c):
        return _NO_TRANS, max(s0 if r > 1 else c, 1)
    if s0 == 1 and (c == 1 or s1 >= r):
        return _TRANS, max(s1 if c > 1 else r, 1)
    return None


def _ready(X: Tensor) -> Tensor:
    """X (b, r, c) bf16 on the CPU whose matrices CBLAS can read in place (a copy only if needed)."""
    if X.dtype != torch.bfloat16 or X.device.type != "cpu":
        raise ValueError(f"the bf16 route takes bf16 CPU tensors, not {X.dtype} on {X.device}")
    return X if X.shape[0] == 0 or _layout(X[0]) is not None else X.contiguous()


def matmul(A: Tensor, B: Tensor, *, ia: Tensor | None = None, ib: Tensor | None = None, out: Tensor | None = None,
           accumulate: bool = False) -> Tensor:
    """out[h] = A[ia[h]] @ B[ib[h]] in float32 from bf16 A (a, m, k) and B (b, k, p) -> (n, m, p). `out`: a float32
    contiguous (n, m, p) to write into (returned), or to add the products to with `accumulate`. Index tensors map
    each output head to its factors (default: h itself); no factor is copied."""
    A, B = _ready(A), _ready(B)
    ia_l = range(A.shape[0]) if ia is None else ia.tolist()
    ib_l = range(B.shape[0]) if ib is None else ib.tolist()
    n, m, k, p = len(ia_l), A.shape[1], A.shape[2], B.shape[2]
    if len(ib_l) != n or B.shape[1] != k:
        raise ValueError(f"bf16 matmul: shapes {tuple(A.shape)} and {tuple(B.shape)} with {n} and {len(ib_l)} heads")
    out = torch.empty(n, m, p) if out is None else out
    if not (out.is_contiguous() and out.dtype == torch.float32 and tuple(out.shape) == (n, m, p)):
        raise ValueError(f"bf16 matmul: the output must be float32 contiguous ({n}, {m}, {p})")
    if n == 0 or m == 0 or p == 0 or k == 0:
        return out if accumulate else out.zero_()
    ta, lda = _layout(A[0])
    tb, ldb = _layout(B[0])
    gemm, size = _gemm(), A.element_size()
    a0, b0, c0 = A.data_ptr(), B.data_ptr(), out.data_ptr()
    sa, sb, sc = A.stride(0) * size, B.stride(0) * size, m * p * out.element_size()
    beta = 1.0 if accumulate else 0.0
    for h, (i, j) in enumerate(zip(ia_l, ib_l, strict=True)):
        gemm(_ROW_MAJOR, ta, tb, m, p, k, 1.0, a0 + i * sa, lda, b0 + j * sb, ldb, beta, c0 + h * sc, p)
    return out


def split3(R: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Three bf16 tensors whose sum is float32 R exactly (hi + mid + lo == R, each term rounded from the remainder
    of the ones before): bf16 keeps 8 of float32's 24 significand bits, so three terms hold all of them, for R in
    the normal range: |R| at most bf16's largest number (3.39e38; above it `hi` rounds to inf) and not so small
    that a remainder falls below bf16's normal range (|R| > ~2⁻¹¹⁰), or zero."""
    hi = R.to(torch.bfloat16)
    rest = R - hi.float()  # exact: hi is R rounded to its top 8 bits
    mid = rest.to(torch.bfloat16)
    lo = (rest - mid.float()).to(torch.bfloat16)  # at most 8 significant bits left: exact in bf16
    return hi, mid, lo


def matmul_f32(X: Tensor, R: Tensor, *, idx: Tensor | None = None) -> Tensor:
    """X[idx[h]] @ R[h] in float32 from bf16 X (a, m, k) and float32 R (n, k, p): R split into three bf16 terms
    (`split3`), three GEMMs accumulated in float32, smallest first."""
    return _split_matmul(X, split3(R), idx=idx)


def _split_matmul(X: Tensor, parts: tuple[Tensor, Tensor, Tensor], *, idx: Tensor | None = None,
                  out: Tensor | None = None) -> Tensor:
    """X[idx[h]] @ (hi + mid + lo)[h] in float32 for `parts` = (hi, mid, lo) from `split3`: lo first, then mid and
    hi added in place (the small terms summed before they meet the large one). `out`: as `matmul`'s."""
    hi, mid, lo = parts
    out = matmul(X, lo, ia=idx, out=out)
    matmul(X, mid, ia=idx, out=out, accumulate=True)
    return matmul(X, hi, ia=idx, out=out, accumulate=True)


def row_norms(X: Tensor, R: Tensor, idx: Tensor | None = None) -> Tensor:
    """Row norms of X[idx[h]] @ R[h]ᵀ (n, rows) for bf16 X (m, rows, d) and a float32 root R (n, d, d), one head
    at a time in one reused (rows, d) buffer."""
    hi, mid, lo = split3(R.mT)  # (n, d, d): R[h]ᵀ, strided: the GEMM reads it transposed in place
    n, rows = R.shape[0], X.shape[-2]
    ids = list(range(n)) if idx is None else idx.tolist()
    out = torch.empty(n, rows, dtype=torch.float32)
    buf = torch.empty(1, rows, R.shape[-2], dtype=torch.float32)
    for h, i in enumerate(ids):
        _split_matmul(X[i: i + 1], (hi[h: h + 1], mid[h: h + 1], lo[h: h + 1]), out=buf)
        torch.linalg.vector_norm(buf[0], dim=-1, out=out[h])
    return out
