"""Factored linear algebra: everything per head from d_head x d_head products, never a d_model x d_model matrix.

A head's factors are tall matrices X (rows, d): W_Q (D, d), W_K (Dk, d), W_V (Dk, dv), W_Oᵀ (D, dv).
Their Gram matrices XᵀX (d, d) are cheap batched matmuls. From a Gram come the singular values of X (its
eigenvalues, `eigvalsh`), a square root R with RᵀR = XᵀX (equal to the R of X = QR up to an orthogonal factor on
the left, which no singular value or norm below can see), and a whitener Z with XZ orthonormal. R and Z come from
a Cholesky factorisation where the Gram is safely positive definite, else from its eigendecomposition.

A Gram squares X's condition number, so in float32 it resolves only directions with σ/σ_max above about
√(rows·eps) ≈ 1 %. `GramFactor.unresolved` names the heads the fast route cannot give exactly (read from the
eigenvalues it computes anyway); the caller recomputes those in float64 (`HeadProducts.exact`). The one rank cut
that remains is RANK_RTOL, the same in every precision.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from qkinspect.metrics import lapack


class cached:  # noqa: N801 (used as a decorator, like functools.cached_property)
    """A property computed on first use and stored in the instance, without a lock.

    `functools.cached_property` holds one lock per class attribute (not per instance) while it computes, on
    Python < 3.12: two threads measuring two layers at once would take turns on every Gram. Here two threads
    asking for the same attribute of the same instance at once may both compute it (the same value); callers
    that share an instance across threads ask for each attribute in one thread first.

    Example:
        >>> class A:
        ...     @cached
        ...     def x(self) -> int:
        ...         print("computed")
        ...         return 1
        >>> a = A()
        >>> a.x + a.x
        computed
        2
    """

    def __init__(self, func):
        self.func = func
        self.__doc__ = func.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.func(instance)  # later lookups find the instance's entry
        return value


CHUNK_BYTES = 8 << 20  # large per-head temporaries are formed in pieces of about this size (see row_norms)
SAFE = 8.0  # Cholesky where λ_min > SAFE x the rank tolerance: every direction resolved, with room for rounding
RANK_RTOL = 1e-5  # directions with σ <= RANK_RTOL · σ_max count as zero, in every precision (λ <= 1e-10 λ_max)
EXACT_MARGIN = 1e3  # the fast route is exact where λ_min > EXACT_MARGIN · √rows · eps · λ_max (see `unresolved`)


class GramFactor:
    """The Gram matrices XᵀX of a batch of tall matrices X (n, rows, d), decomposed on first use.

    Eigenvalues at or below `RANK_RTOL² · λ_max` (σ <= 1e-5 σ_max), or below what the Gram resolves in its dtype
    (`max(rows, d) · eps · λ_max`, numpy's matrix_rank rule applied to λ = σ²), count as zero in `evals`, `rank`,
    `root` and `whitener`. In float64 the first is the larger for rows < 4.5e5, so the cut is RANK_RTOL; in float32
    the second is, but a head it cuts is `unresolved` and recomputed in float64 by the caller.
    Heads whose smallest eigenvalue is more than SAFE times that tolerance (and whose Cholesky factorisation
    succeeds) take R and Z from the Cholesky factor L (R = Lᵀ, Z = L⁻ᵀ, a few ms for a batch of 128 x 128);
    the others from a symmetric eigendecomposition (R = diag(σ) Uᵀ, Z = U diag(1/σ) on the resolved directions).

    Example:
        >>> X = torch.randn(4, 64, 8, dtype=torch.float64)
        >>> f = GramFactor(X.mT @ X, rows=64)
        >>> torch.allclose(f.sigma, torch.linalg.svdvals(X)), torch.allclose(f.root.mT @ f.root, f.gram)
        (True, True)
    """

    def __init__(self, gram: Tensor, rows: int):
        self.gram = (gram + gram.mT) / 2  # (n, d, d), exactly symmetric
        self.rows = rows

    @cached
    def _spectrum(self) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """(eigenvalues (n, d) descending as computed, Cholesky factors L (n, d, d), cholesky-safe heads (n,),
        eigenvectors (m, d, d) of the m other heads or None). Eigenvalues of the other heads come from the same
        eigendecomposition as their eigenvectors, so rank, root and whitener agree."""
        evals = eigvalsh(self.gram).flip(-1)  # ascending -> descending
        L, info = threaded(lapack.cholesky_ex, self.gram)  # (n, d, d) lower; info (n,) 0 where it succeeded
        safe = (evals[..., -1] > SAFE * self._tol(evals)[..., 0]) & (info == 0)
        if bool(safe.all()):
            return evals, L, safe, None
        ev, vecs = threaded(torch.linalg.eigh, self.gram[~safe])  # ascending
        evals = evals.clone()
        evals[~safe] = ev.flip(-1)
        return evals, L, safe, vecs.flip(-1)  # columns paired with the descending eigenvalues

    def _tol(self, evals: Tensor) -> Tensor:
        """(n, 1): the largest eigenvalue counted as zero, per head (the rank cut, or the Gram's resolution)."""
        resolution = max(self.rows, self.gram.shape[-1]) * torch.finfo(evals.dtype).eps
        return max(RANK_RTOL**2, resolution) * evals[..., :1].clamp_min(0)

    @property
    def unresolved(self) -> Tensor:
        """(n,) heads this dtype's Gram cannot give to 1e-3 in every metric: λ_min <= EXACT_MARGIN · √rows · eps ·
        λ_max (σ_min/σ_max below about 3-9 % in float32 for rows = 576-4096). Measured: the largest float32 error,
        on heads whose σ span a decade or more, grows like √rows · eps / (λ_min/λ_max), reaching 1e-3 at about
        130 · √rows · eps; the margin leaves a factor 8. Never in float64, whose Gram resolves every direction
        above the cut (σ_min/σ_max > RANK_RTOL) to 1e-4 for rows up to 16384. Zero heads are not unresolved."""
        if self.gram.dtype == torch.float64:
            return torch.zeros(self.gram.shape[0], dtype=torch.bool, device=self.gram.device)
        evals = self._spectrum[0]
        top = evals[..., 0]
        limit = EXACT_MARGIN * self.rows**0.5 * torch.finfo(evals.dtype).eps
        return (top > 0) & (evals[..., -1] <= limit * top)

    @cached
    def evals(self) -> Tensor:
        """Eigenvalues of XᵀX (n, d) descending, resolved ones only (the rest set to 0)."""
        evals = self._spectrum[0]
        return torch.where(evals > self._tol(evals), evals, torch.zeros_like(evals))

    @property
    def rank(self) -> Tensor:
        """Resolved directions per head (n,) int64."""
        return (self.evals > 0).sum(-1)

    @property
    def sigma(self) -> Tensor:
        """Singular values of X, descending (n, d)."""
        return self.evals.sqrt()

    @cached
    def root(self) -> Tensor:
        """R (n, d, d) with RᵀR = XᵀX on the resolved directions."""
        _, L, safe, vecs = self._spectrum
        R = L.mT  # (n, d, d): G = L Lᵀ = (Lᵀ)ᵀ Lᵀ
        if vecs is None:
            return R
        R = R.clone()
        R[~safe] = self.sigma[~safe].unsqueeze(-1) * vecs.mT  # diag(σ) Uᵀ: (m, d, 1) * (m, d, d)
        return R

    @cached
    def whitener(self) -> Tensor:
        """Z (n, d, d) with X Z an orthonormal basis of X's column space, padded with zero columns."""
        _, L, safe, vecs = self._spectrum
        Z = threaded(lapack.inverse_lower, L).mT  # L⁻ᵀ: Zᵀ G Z = L⁻¹ L Lᵀ L⁻ᵀ = I
        if vecs is None:
            return Z
        s = self.sigma[~safe]
        inv = torch.where(s > 0, 1 / s.clamp_min(torch.finfo(s.dtype).tiny), torch.zeros_like(s))
        Z[~safe] = vecs * inv.unsqueeze(-2)  # U diag(1/σ): (m, d, d) * (m, 1, d) scales columns
        return Z

    def fro2(self) -> Tensor:
        """Squared Frobenius norm of X (n,): the trace of the Gram (exact, not truncated)."""
        return self.gram.diagonal(dim1=-2, dim2=-1).sum(-1)

    def index(self, idx: Tensor) -> GramFactor:
        """The factors of X[idx] (e.g. each query head's KV head), decomposed once for the distinct heads."""
        return _Indexed(self, idx)


class _Indexed(GramFactor):
    """A GramFactor of X[idx] whose decompositions are the parent's, indexed (none is computed twice)."""

    def __init__(self, parent: GramFactor, idx: Tensor):
        self.parent, self.idx = parent, idx
        self.gram, self.rows = parent.gram[idx], parent.rows

    @cached
    def evals(self) -> Tensor:
        return self.parent.evals[self.idx]

    @cached
    def root(self) -> Tensor:
        return self.parent.root[self.idx]

    @cached
    def whitener(self) -> Tensor:
        return self.parent.whitener[self.idx]

    @property
    def unresolved(self) -> Tensor:
        return self.parent.unresolved[self.idx]


def factor_gram(gram: Tensor, rows: int) -> GramFactor:
    """GramFactor of a batch of Gram matrices (n, d, d) of matrices with `rows` rows.

    Example:
        >>> X = torch.randn(4, 64, 8, dtype=torch.float64)
        >>> f = factor_gram(X.mT @ X, rows=64)
        >>> torch.allclose(f.sigma, torch.linalg.svdvals(X))
        True
    """
    return GramFactor(gram, rows)


def gram_factor(X: Tensor) -> GramFactor:
    """GramFactor of a batch of tall matrices X (n, rows, d)."""
    return GramFactor(X.mT @ X, rows=X.shape[-2])  # (n, d, rows) @ (n, rows, d) -> (n, d, d)


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


def row_norms(X: Tensor, R: Tensor, idx: Tensor | None = None) -> Tensor:
    """Row norms of X Yᵀ from X (m, rows, d) and a root R of YᵀY (n, d, d): ||X[i] Rᵀ|| = ||X[i] Yᵀ||, for
    X[idx] when `idx` (n,) is given (else m == n) -> (n, rows).

    On a CPU the (n, rows, d) product is formed a few heads at a time in one reused buffer: a fresh 64 MB tensor
    per layer costs as much in page faults as the GEMM itself, and X[idx] is never copied whole.
    """
    n, rows = R.shape[0], X.shape[-2]
    if X.device.type != "cpu":
        Xi = X if idx is None else X[idx]
        return torch.linalg.vector_norm(Xi @ R.mT, dim=-1)  # (n, rows, d) @ (n, d, d) -> (n, rows)
    step = max(1, CHUNK_BYTES // (rows * R.shape[-1] * R.element_size()))
    out = torch.empty(n, rows, dtype=R.dtype)
    buf = torch.empty(min(step, n), rows, R.shape[-1], dtype=R.dtype)
    for i in range(0, n, step):
        j = min(i + step, n)
        Xi = X[i:j] if idx is None else X[idx[i:j]]
        prod = torch.matmul(Xi, R[i:j].mT, out=buf[: j - i])  # (c, rows, d) @ (c, d, d)
        torch.linalg.vector_norm(prod, dim=-1, out=out[i:j])
    return out


def trace(A: Tensor) -> Tensor:
    """Trace of a batch of square matrices (n, d, d) -> (n,)."""
    return A.diagonal(dim1=-2, dim2=-1).sum(-1)


def tr_prod(A: Tensor, B: Tensor) -> Tensor:
    """tr(A B) for batches (n, a, b) and (n, b, a), in O(ab) without forming the product."""
    return (A * B.mT).sum((-2, -1))  # Σ_ij A_ij B_ji; B.mT (n, a, b)


def threaded(fn, A: Tensor):
    """fn on a batch of small matrices (n, a, b), split across torch's CPU threads, each running LAPACK on one
    core. A small decomposition is a long chain of short parallel steps: with two OpenMP threads per call each
    step ends in a barrier, and on a shared machine a descheduled thread stalls every barrier (a 15 ms eigvalsh
    batch was seen to take 1 s). One thread per chunk has no barriers, and torch releases the GIL, so the
    chunks run in parallel. `fn` returns a tensor or a tuple of tensors."""
    if A.device.type != "cpu":
        return fn(A)
    workers = min(torch.get_num_threads(), A.shape[0] // 4)
    if workers < 2:
        with one_thread():
            return fn(A)
    parts = list(_linalg_pool(workers).map(fn, A.chunk(workers)))
    if isinstance(parts[0], Tensor):
        return torch.cat(parts)
    return tuple(torch.cat(p) for p in zip(*parts, strict=True))


_POOLS: dict[tuple[int, int, int], ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _linalg_pool(workers: int) -> ThreadPoolExecutor:
    """A pool of `workers` threads kept for the calling thread (two layers measured side by side, each with
    threads of its own, do not queue for one pool), each running torch on one thread.

    Kept, not made per call: a fresh thread pays for its start and for MKL's per-thread set-up on its first
    LAPACK call, which cost 3-5x the work itself for a batch of 32 Cholesky factors or triangular inverses (about
    60 ms per 7B layer, 2 s per model). Each worker sets its own thread count once, as it starts. The pool goes
    with the calling thread (its threads end once the pool is collected)."""
    return per_thread(("linalg", workers), lambda: _new_pool(workers, 1, "qkinspect-linalg"))


def per_thread(key: object, make):
    """An object made by `make()` once per calling thread and process (a forked child makes its own)."""
    mine = vars(_LOCAL).setdefault("objects", {})
    pid = os.getpid()
    if mine.get("pid") != pid:
        mine.clear()
        mine["pid"] = pid
    if key not in mine:
        mine[key] = make()
    return mine[key]


_LOCAL = threading.local()


def worker_pool(workers: int, threads: int) -> ThreadPoolExecutor:
    """A pool of `workers` threads kept for the life of the process (a forked child makes its own), each running
    torch on `threads` threads of its own, whatever the caller's count is then or later."""
    key = (os.getpid(), workers, threads)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = _new_pool(workers, threads, "qkinspect-worker")
    return pool


def _new_pool(workers: int, threads: int, name: str) -> ThreadPoolExecutor:
    with _thread_count(threads):  # the global count new threads read; restored once every worker has started
        pool = ThreadPoolExecutor(workers, thread_name_prefix=name, initializer=_threads_here, initargs=(threads,))
        started = threading.Barrier(workers)
        list(pool.map(lambda _: started.wait(), range(workers)))  # one task per worker: all start now
    return pool


def _threads_here(threads: int) -> None:
    """torch on `threads` threads in the calling thread, for good: torch sets a thread's count from the global one on
    its first parallel operation unless it has been initialised (get_num_threads does that) before set_num_threads."""
    torch.get_num_threads()
    torch.set_num_threads(threads)


@contextmanager
def one_thread() -> Iterator[None]:
    """torch (OpenMP, MKL) on one thread in the calling thread, and in threads started meanwhile; the count before
    is restored on exit. For many small products in a row (the experiment's edits): on a busy machine one thread
    without barriers is several times faster than two.

    Example:
        >>> with one_thread():
        ...     torch.get_num_threads()
        1
    """
    with _thread_count(1):
        yield


@contextmanager
def _thread_count(threads: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def eigvals(C: Tensor) -> Tensor:
    """Eigenvalues of a batch of square matrices (n, d, d), complex."""
    return threaded(torch.linalg.eigvals, C)


def eigvalsh(G: Tensor) -> Tensor:
    """Eigenvalues of a batch of symmetric matrices (n, d, d), ascending (no eigenvectors: cheaper than eigh)."""
    return threaded(torch.linalg.eigvalsh, G)


def svdvals(A: Tensor) -> Tensor:
    """Singular values of a batch (n, a, b), descending."""
    return threaded(torch.linalg.svdvals, A)
