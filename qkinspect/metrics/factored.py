"""Factored linear algebra: everything per head from d_head x d_head products, never a d_model x d_model matrix.

A head's factors are tall matrices X (rows, d): W_Q (D, d), W_K (Dk, d), W_V (Dk, dv), W_Oᵀ (D, dv).
Their Gram matrices XᵀX (d, d) are cheap batched matmuls; the symmetric eigendecomposition of a Gram gives
the singular values of X, a square root R with RᵀR = XᵀX (equal to the R of X = QR up to an orthogonal factor
on the left, which no singular value or norm below can see), and a whitener Z with XZ orthonormal.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class GramFactor:
    """The Gram matrices XᵀX of a batch of tall matrices X (n, rows, d) and their eigendecomposition.

    Eigenvalues at or below `max(rows, d) * eps * λ_max` are below what the Gram resolves in its dtype
    (numpy's matrix_rank rule, applied to λ = σ²): they count as zero in `rank`, `root` and `whitener`.
    """

    gram: Tensor  # (n, d, d)
    evals: Tensor  # (n, d) descending, resolved ones only (the rest set to 0)
    evecs: Tensor  # (n, d, d) column i pairs with evals[:, i]
    rank: Tensor  # (n,) int64

    @property
    def sigma(self) -> Tensor:
        """Singular values of X, descending (n, d)."""
        return self.evals.sqrt()

    @property
    def root(self) -> Tensor:
        """R (n, d, d) with RᵀR = XᵀX: R = diag(σ) Uᵀ."""
        return self.sigma.unsqueeze(-1) * self.evecs.mT  # (n, d, 1) * (n, d, d)

    @property
    def whitener(self) -> Tensor:
        """Z (n, d, d) = U diag(1/σ) on the resolved directions, 0 elsewhere: X Z is an orthonormal basis of
        X's column space, padded with zero columns."""
        s = self.sigma
        inv = torch.where(self.evals > 0, 1 / s.clamp_min(torch.finfo(s.dtype).tiny), torch.zeros_like(s))
        return self.evecs * inv.unsqueeze(-2)  # (n, d, d) * (n, 1, d): scale columns

    def fro2(self) -> Tensor:
        """Squared Frobenius norm of X (n,): the trace of the Gram (exact, not truncated)."""
        return self.gram.diagonal(dim1=-2, dim2=-1).sum(-1)

    def index(self, idx: Tensor) -> GramFactor:
        """The factors of X[idx] (e.g. each query head's KV head)."""
        return GramFactor(self.gram[idx], self.evals[idx], self.evecs[idx], self.rank[idx])


def factor_gram(gram: Tensor, rows: int) -> GramFactor:
    """Eigendecompose a batch of Gram matrices (n, d, d) of matrices with `rows` rows.

    Example:
        >>> X = torch.randn(4, 64, 8, dtype=torch.float64)
        >>> f = factor_gram(X.mT @ X, rows=64)
        >>> torch.allclose(f.sigma, torch.linalg.svdvals(X))
        True
    """
    gram = (gram + gram.mT) / 2  # exact symmetry for eigh
    evals, evecs = threaded(torch.linalg.eigh, gram)  # ascending
    evals, evecs = evals.flip(-1), evecs.flip(-1)  # (n, d), (n, d, d): descending
    d = gram.shape[-1]
    tol = max(rows, d) * torch.finfo(gram.dtype).eps * evals[..., :1].clamp_min(0)  # (n, 1)
    resolved = evals > tol
    evals = torch.where(resolved, evals, torch.zeros_like(evals))
    return GramFactor(gram, evals, evecs, resolved.sum(-1))


def gram_factor(X: Tensor) -> GramFactor:
    """GramFactor of a batch of tall matrices X (n, rows, d)."""
    return factor_gram(X.mT @ X, rows=X.shape[-2])  # (n, d, rows) @ (n, rows, d) -> (n, d, d)


def paired(Y: Tensor, X: Tensor, kv: Tensor, grouped: bool) -> Tensor:
    """Per query head h: Y[kv[h]]ᵀ X[h] for Y (G, rows, e) and X (n, rows, d) -> (n, e, d).

    `grouped` (all query heads in order) broadcasts each KV head over its group instead of copying it.
    """
    if grouped:
        return per_group(lambda Xr: Y.mT @ Xr, X, Y.shape[0])  # (G, e, rows) @ (G, rows, d) per group member
    return Y[kv].mT @ X  # (n, e, rows) @ (n, rows, d) -> (n, e, d)


def per_group(fn, X: Tensor, G: int) -> Tensor:
    """Apply `fn` to the r-th member of every KV group at once, r = 0..rep-1, and restack per query head.

    X (n, ...) with n = G * rep, heads of a group contiguous; fn maps (G, ...) -> (G, ...). One strided batched
    GEMM per r is several times faster than a broadcast matmul or gathering a copy of the KV heads.
    """
    n = X.shape[0]
    if n == G:
        return fn(X)
    Xg = X.reshape(G, n // G, *X.shape[1:])  # (n, ...) -> (G, rep, ...)
    out = torch.stack([fn(Xg[:, r]) for r in range(n // G)], 1)  # rep x (G, ...) -> (G, rep, ...)
    return out.reshape(n, *out.shape[2:])  # (G, rep, ...) -> (n, ...)


def row_norms(X: Tensor, R: Tensor) -> Tensor:
    """Row norms of X Yᵀ from X (n, rows, d) and a root R of YᵀY (n, d, d): ||X[i] Rᵀ|| = ||X[i] Yᵀ||."""
    return torch.linalg.vector_norm(X @ R.mT, dim=-1)  # (n, rows, d) @ (n, d, d) -> (n, rows)


def trace(A: Tensor) -> Tensor:
    """Trace of a batch of square matrices (n, d, d) -> (n,)."""
    return A.diagonal(dim1=-2, dim2=-1).sum(-1)


def tr_prod(A: Tensor, B: Tensor) -> Tensor:
    """tr(A B) for batches (n, a, b) and (n, b, a), in O(ab) without forming the product."""
    return (A * B.mT).sum((-2, -1))  # Σ_ij A_ij B_ji; B.mT (n, a, b)


def threaded(fn, A: Tensor):
    """fn on a batch of small matrices (n, a, b), split across torch's CPU threads. LAPACK's small
    decompositions run each matrix on one core and torch releases the GIL, so the chunks run in parallel
    (2-3x on two cores for eigvals and svdvals). `fn` returns a tensor or a tuple of tensors."""
    workers = min(torch.get_num_threads(), A.shape[0] // 4)
    if A.device.type != "cpu" or workers < 2:
        return fn(A)
    with ThreadPoolExecutor(workers, thread_name_prefix="qkinspect-linalg") as pool:
        parts = list(pool.map(fn, A.chunk(workers)))
    if isinstance(parts[0], Tensor):
        return torch.cat(parts)
    return tuple(torch.cat(p) for p in zip(*parts, strict=True))


def eigvals(C: Tensor) -> Tensor:
    """Eigenvalues of a batch of square matrices (n, d, d), complex."""
    return threaded(torch.linalg.eigvals, C)


def svdvals(A: Tensor) -> Tensor:
    """Singular values of a batch (n, a, b), descending."""
    return threaded(torch.linalg.svdvals, A)
