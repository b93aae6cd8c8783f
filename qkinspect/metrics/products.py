"""One layer's heads in compute precision, with every d_head x d_head product computed once, on first use.

Metric functions take a `HeadProducts` and ask for what they need (`p.fq`, `p.c_qk`, `p.sigma_qk` ...), so a
run that asks for symmetry alone never pays for eigenvalues or the OV circuit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from qkinspect.layer import AttentionLayer, BlockSpec
from qkinspect.metrics import backend
from qkinspect.metrics.factored import (
    GramFactor,
    cached,
    eigvals,
    eigvalsh,
    paired,
    per_group,
    row_norms,
    svdvals,
    tr_prod,
    trace,
)


class HeadProducts:
    """The selected query heads of one layer (n of them) and their key/value heads, cast up to `dtype`.

    Shapes: Q (n, D, d), K (G, Dk, d), V (G, Dk, dv), O (n, dv, D) or None; `kv` (n,) maps each query head to
    its KV head h // (H // G). A head with non-finite entries is found by its Gram (computed on first use of
    the factor), zeroed (so no decomposition fails) and flagged in `bad`, for the caller to report as NaN.

    On the bf16 product route (`qkinspect.metrics.backend`; float32 on a CPU only) bf16 weights are kept as stored
    and the large products read them directly; Q, K, V and O are then cast to float32 only when something asks
    for them, and `route` says which route this layer's products took ("bf16", or the dtype's name).

    Example:
        >>> p = HeadProducts(layer, torch.tensor([0, 3]), dtype=torch.float64)  # doctest: +SKIP
        >>> p.sigma_qk.shape, p.c_qk.shape  # singular values of M, and W_Kᵀ W_Q, for heads 0 and 3  # doctest: +SKIP
        (torch.Size([2, 64]), torch.Size([2, 64, 64]))
    """

    def __init__(self, layer: AttentionLayer, heads: Tensor | None = None, *, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", bf16: bool | None = None):
        """`bf16`: take the bf16 product route (True; every weight must be stored in bf16) or the float route
        (False) whatever the process's route is (`backend.route()`, which decides when None): for benchmarks."""
        if bf16 is None:
            bf16 = backend.uses_bf16(dtype, device) and _all_bf16(layer)
        elif bf16 and not _all_bf16(layer):
            raise ValueError("the bf16 product route reads bf16 weights only")
        s = layer.spec
        sel = torch.arange(s.n_heads) if heads is None else heads.to(torch.int64)
        self.spec, self.heads, self.dtype = s, sel, dtype
        self.grouped = bool(heads is None or torch.equal(sel, torch.arange(s.n_heads)))
        self.same_qk = _same_qk(layer)
        self._layer = layer  # for `exact`: the stored tensors, not this precision's copies
        self._load(layer, device, bf16)

    def _load(self, layer: AttentionLayer, device: str | torch.device, bf16: bool) -> None:
        """Cast (half precision up before anything; bf16 weights kept on the bf16 route) and select the query
        heads; the finiteness check comes with each factor's Gram (`_checked`)."""

        def take(t: Tensor | None, per_query_head: bool, keep: bool = False) -> Tensor | None:
            if t is None:
                return None
            t = t if self.grouped or not per_query_head else t[self.heads]
            return t.to(device=device, dtype=None if keep else self.dtype)

        self.bf16 = bf16
        self.route = "bf16" if bf16 else str(self.dtype).removeprefix("torch.")
        self._raw = {"Q": take(layer.W_Q, True, bf16), "K": take(layer.W_K, False, bf16),
                     "V": take(layer.W_V, False, bf16), "O": take(layer.W_O, True, bf16)}
        self._checked_factors: dict[str, _Checked] = {}
        self._cast: dict[str, Tensor] = {}
        self.device = self._raw["Q"].device
        self.kv = (self.heads // self.spec.group_size).to(self.device)  # h // (H // G), never h % G
        self.b_Q, self.b_K, self.b_V = take(layer.b_Q, True), take(layer.b_K, False), take(layer.b_V, False)

    def _checked(self, name: str) -> _Checked:
        """Factor `name` with its Gram and its non-finite heads (zeroed), computed once."""
        if name not in self._checked_factors:
            X = self._raw[name]
            outer = name == "O"  # W_O is (n, dv, D): its rows are the factor's columns
            self._checked_factors[name] = _check(X, lambda X: self._gram(X, outer))
        return self._checked_factors[name]

    def _gram(self, X: Tensor, outer: bool) -> Tensor:
        """XᵀX (n, d, rows) @ (n, rows, d) -> (n, d, d), or X Xᵀ when `outer` (n, dv, D) @ (n, D, dv) -> (n, dv, dv)."""
        return self._mm(X, X.mT) if outer else self._mm(X.mT, X)

    def _mm(self, A: Tensor, B: Tensor) -> Tensor:
        """A @ B on this layer's product route: float32 from bf16 factors on the bf16 route, else torch's own."""
        return backend.matmul(A, B) if self.bf16 else A @ B

    def _x(self, name: str) -> Tensor:
        """Factor `name` as the products read it (bf16 on the bf16 route), non-finite heads zeroed."""
        return self._checked(name).X

    def _factor(self, name: str) -> Tensor:
        """Factor `name` in `dtype`, non-finite heads zeroed (cast once from bf16 on the bf16 route)."""
        if name not in self._cast:
            self._cast[name] = self._x(name).to(self.dtype)
        return self._cast[name]

    def shape(self, name: str) -> torch.Size:
        """The shape of factor "Q", "K", "V" or "O" (which must be present), without casting or checking it."""
        return self._raw[name].shape

    @property
    def _one_kv_per_query(self) -> bool:
        """Every query head selected, each with a KV head of its own (no grouping): `kv` is 0, 1, ..., n - 1."""
        return self.grouped and self._raw["K"].shape[0] == self.n

    def _per_query(self, X: Tensor) -> Tensor:
        """X (G, ...) per KV head -> (n, ...) per query head: X itself when `kv` is the identity, else X[kv]."""
        return X if self._one_kv_per_query else X[self.kv]

    def _per_query_factor(self, f: GramFactor) -> GramFactor:
        return f if self._one_kv_per_query else f.index(self.kv)

    # -- the factors, non-finite heads zeroed (their metrics are NaN: `bad`, `bad_ov`) ------------------------
    @property
    def Q(self) -> Tensor:
        return self._factor("Q")

    @property
    def K(self) -> Tensor:
        return self._factor("K")

    @property
    def V(self) -> Tensor:
        return self._factor("V")

    @property
    def O(self) -> Tensor | None:  # noqa: E743 (the paper's name)
        return None if self._raw["O"] is None else self._factor("O")

    @property
    def has_o(self) -> bool:
        return self._raw["O"] is not None

    @cached
    def _bad_kv(self) -> Tensor:
        return self._per_query(self._checked("K").bad | self._checked("V").bad)

    @cached
    def bad(self) -> Tensor:
        """(n,) query heads whose W_Q, or whose KV head's W_K or W_V, has non-finite entries (or overflows)."""
        return self._checked("Q").bad | self._bad_kv

    @cached
    def bad_ov(self) -> Tensor:
        """(n,) heads whose W_O, W_K or W_V is non-finite (the OV metrics' NaN mask)."""
        return self._bad_kv if self._raw["O"] is None else self._checked("O").bad | self._bad_kv

    # -- shapes -----------------------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return self._raw["Q"].shape[0]

    @property
    def square(self) -> bool:
        """Queries and keys read the same space (D == Dk): symmetry, eigenvalues, Q-vs-K/V similarity defined."""
        return self._raw["Q"].shape[1] == self._raw["K"].shape[1]

    def nan(self) -> Tensor:
        return torch.full((self.n,), float("nan"), dtype=self.dtype, device=self.device)

    # -- Gram factors -----------------------------------------------------------------------------------
    @cached
    def fq(self) -> GramFactor:
        return GramFactor(self._checked("Q").gram, rows=self.shape("Q")[-2])

    @cached
    def fk_all(self) -> GramFactor:
        return GramFactor(self._checked("K").gram, rows=self.shape("K")[-2])

    @cached
    def fk(self) -> GramFactor:
        return self.fq if self.same_qk else self._per_query_factor(self.fk_all)

    @cached
    def fv_all(self) -> GramFactor:
        return GramFactor(self._checked("V").gram, rows=self.shape("V")[-2])

    @cached
    def fv(self) -> GramFactor:
        return self._per_query_factor(self.fv_all)

    @cached
    def fro2_qk(self) -> Tensor:
        """||M||_F² = tr(W_QᵀW_Q · W_KᵀW_K) per head (n,), without forming M."""
        return tr_prod(self.fq.gram, self.fk.gram)

    # -- numerics: which heads this precision resolves, and the ranks kept -----------------------------------
    @property
    def unresolved(self) -> Tensor:
        """(n,) finite heads that the Grams of this dtype cannot resolve (`GramFactor.unresolved`): W_Q, its KV
        head's W_K or W_V, and W_O and the joint [W_Q W_K] where a metric decomposed them. Ask after the metrics."""
        out = self.fq.unresolved | self.fk.unresolved | self.fv.unresolved
        for name in ("fo", "f_joint"):
            if name in vars(self):  # a cached attribute is stored in the instance: only the factors a metric used
                out = out | vars(self)[name].unresolved
        return out & ~self.bad

    @property
    def ranks(self) -> dict[str, Tensor]:
        """Numerical rank kept (σ > RANK_RTOL · σ_max) of W_Q, W_K, W_V per query head, (n,) each."""
        return {"rank_q": self.fq.rank, "rank_k": self.fk.rank, "rank_v": self.fv.rank}

    def exact(self, mask: Tensor) -> HeadProducts:
        """The heads in `mask` (n,) again, from the stored tensors, in float64 (whose Gram resolves them)."""
        return HeadProducts(self._layer, self.heads[mask.cpu()], dtype=torch.float64, device=self.device)

    # -- cross products (n, e, d) -------------------------------------------------------------------------
    @cached
    def c_qk(self) -> Tensor:
        """W_Kᵀ W_Q per head (n, d, d): its eigenvalues are the nonzero eigenvalues of W_Q W_Kᵀ."""
        return self.fq.gram if self.same_qk else self._paired(self._x("K"), self._x("Q"))

    @cached
    def c_qv(self) -> Tensor:
        """W_Vᵀ W_Q per head (n, dv, d)."""
        return self._paired(self._x("V"), self._x("Q"))

    @cached
    def c_kv(self) -> Tensor:
        """W_Vᵀ W_K per head (n, dv, d)."""
        return self._per_query(self._mm(self._x("V").mT, self._x("K")))  # (G, dv, Dk) @ (G, Dk, d) -> (n, dv, d)

    def _paired(self, Y: Tensor, X: Tensor) -> Tensor:
        """Y[kv[h]]ᵀ X[h] per query head (n, e, d) for factors Y (G, rows, e) and X (n, rows, d), on this layer's
        product route."""
        if self.bf16:
            return backend.matmul(Y.mT, X, ia=self.kv)
        return paired(Y, X, self.kv, self.grouped)

    @cached
    def means(self) -> tuple[Tensor, Tensor, Tensor]:
        """Column means over the rows of W_Q (n, d), W_K (n, d), W_V (n, dv) per query head (for CKA)."""
        Q, K, V = (self._x(name).mean(-2, dtype=self.dtype) for name in "QKV")  # bf16 summed in float32
        return Q, self._per_query(K), self._per_query(V)

    # -- the bilinear form M = W_Q W_Kᵀ -----------------------------------------------------------------------
    @cached
    def sigma_qk(self) -> Tensor:
        """Singular values of M (n, d), descending: those of R_Q R_Kᵀ."""
        return svdvals(self.fq.root @ self.fk.root.mT)  # (n, d, d) @ (n, d, d)

    @cached
    def eig_qk(self) -> Tensor:
        """The d eigenvalues of W_Kᵀ W_Q (n, d) complex: M's nonzero eigenvalues, padded with zeros."""
        return eigvals(self.c_qk)

    @cached
    def sym_skew_qk(self) -> tuple[Tensor, Tensor]:
        """Eigenvalues (n, 2d) of M's symmetric part (M + Mᵀ)/2, ascending, and ||(M − Mᵀ)/2||_F² (n,).

        With X = [W_Q W_K] (D, 2d) and a root R of its Gram (RᵀR = XᵀX), X = U R for some U with orthonormal
        columns, so M = U (R_q R_kᵀ) Uᵀ (R_q, R_k: R's first and last d columns): M's symmetric and skew parts
        have the eigenvalues and norms of those of the 2d x 2d matrix P = R_q R_kᵀ. The skew norm comes from P's
        entries, not from ||M||² − ⟨M, Mᵀ⟩, so it keeps its accuracy when M is nearly symmetric.
        """
        d = self.shape("Q")[-1]
        R = self.f_joint.root  # (n, 2d, 2d)
        P = R[..., :d] @ R[..., d:].mT  # (n, 2d, d) @ (n, d, 2d): M in the basis U
        skew2 = ((P - P.mT) / 2).square().sum((-2, -1))
        return eigvalsh((P + P.mT) / 2), skew2

    @cached
    def f_joint(self) -> GramFactor:
        """Factors of [W_Q W_K] (n, D, 2d): its Gram [[W_QᵀW_Q, W_QᵀW_K], [W_KᵀW_Q, W_KᵀW_K]] (n, 2d, 2d)."""
        C = self.c_qk  # W_Kᵀ W_Q (n, d, d)
        joint = torch.cat([torch.cat([self.fq.gram, C.mT], -1), torch.cat([C, self.fk.gram], -1)], -2)
        return GramFactor(joint, rows=self.shape("Q")[-2])

    @cached
    def row_col_norms(self) -> tuple[Tensor, Tensor]:
        """Row norms (n, D) and column norms (n, Dk) of M, from R_K and R_Q without forming M."""
        return self.norms_against(self.fq.root, self.fk.root)

    def norms_against(self, Rq: Tensor, Rk: Tensor) -> tuple[Tensor, Tensor]:
        """Row norms ||W_Q[i] R_kᵀ|| (n, D) and ||W_K[j] R_qᵀ|| (n, Dk) per query head, for roots Rq of W_Q and Rk
        of its KV head's W_K (n, d, d) (R_kᵀR_k = W_KᵀW_K: the row norms of M = W_Q W_Kᵀ, and of Mᵀ)."""
        Q, K = self._x("Q"), self._x("K")
        if self.bf16:  # one head at a time: X bf16 times R split into three exact bf16 terms
            rows = backend.row_norms(Q, Rk)
            return (rows, rows) if self.same_qk else (rows, backend.row_norms(K, Rq, idx=self.kv))
        rows = row_norms(Q, Rk)  # ||W_Q[i] W_Kᵀ||
        if self.same_qk:
            return rows, rows
        if self.grouped:  # each KV head against the roots of its query heads: ||W_K[j] W_Qᵀ||
            cols = per_group(lambda R: row_norms(K, R), Rq, K.shape[0])
        else:
            cols = row_norms(K, Rq, idx=self.kv)
        return rows, cols

    # -- the OV circuit W_OV = W_V W_O --------------------------------------------------------------------------
    @cached
    def fo(self) -> GramFactor:
        """Factors of W_Oᵀ (n, D, dv): Gram W_O W_Oᵀ (n, dv, dv)."""
        return GramFactor(self._checked("O").gram, rows=self.shape("O")[-1])

    @cached
    def sigma_ov(self) -> Tensor:
        """Singular values of W_V W_O (n, dv): those of R_V R_Oᵀ."""
        return svdvals(self.fv.root @ self.fo.root.mT)  # (n, dv, dv) @ (n, dv, dv)

    @cached
    def c_ov(self) -> Tensor:
        """(W_O W_V)ᵀ = W_Vᵀ W_Oᵀ per head (n, dv, dv): same nonzero eigenvalues as W_V W_O."""
        return self._paired(self._x("V"), self._x("O").mT)  # W_Oᵀ: (n, dv, D) -> (n, D, dv)

    @cached
    def eig_ov(self) -> Tensor:
        return eigvals(self.c_ov)


def layer_products(Q: Tensor, K: Tensor, V: Tensor, Rq: Tensor, Rk: Tensor, route: str | None = None) -> list[Tensor]:
    """The eight products of one layer that the default metrics cannot do without, on `route` (default: the
    machine's best, `backend.best_route()`), by `HeadProducts` itself: the Grams of W_Q, W_K, W_V; W_Kᵀ W_Q,
    W_Vᵀ W_Q, W_Vᵀ W_K per query head; the row norms of W_Q R_Kᵀ and W_K R_Qᵀ (directionality). For benchmarks.

    Q (H, D, d), K and V (G, D, d): bf16 on the bf16 route, else cast to float32 here (pass float32 to leave the
    cast out of a timing); Rq, Rk (H, d, d) float32 roots. Query head h reads KV head h // (H // G).
    """
    (H, D, d), G = Q.shape, K.shape[0]
    layer = AttentionLayer(BlockSpec("decoder", 1, H, G, D, d), 0, W_Q=Q, W_K=K, W_V=V)
    p = HeadProducts(layer, bf16=(route or backend.best_route()) == "bf16")
    return [p.fq.gram, p.fk_all.gram, p.fv_all.gram, p.c_qk, p.c_qv, p.c_kv, *p.norms_against(Rq, Rk)]


def _all_bf16(layer: AttentionLayer) -> bool:
    """Every weight the products read is stored in bf16 (a mixed layer takes the float route throughout)."""
    return all(t is None or t.dtype == torch.bfloat16 for t in (layer.W_Q, layer.W_K, layer.W_V, layer.W_O))


def _same_qk(layer: AttentionLayer) -> bool:
    """W_K is W_Q (Reformer's shared-QK attention, or equal tensors): reuse W_Q's products for the keys, so that
    s = 1 exactly. Checked on the stored tensors, before any head selection."""
    Wq, Wk = layer.W_Q, layer.W_K
    if Wk is Wq:
        return True
    if Wq.shape != Wk.shape or Wq.dtype != Wk.dtype:
        return False
    return torch.equal(Wq[0, 0], Wk[0, 0]) and torch.equal(Wq, Wk)  # one row first: most pairs differ there


@dataclass(frozen=True)
class _Checked:
    """One factor X, its Gram, and the heads (n,) whose Gram was not finite; those heads are zeroed in X and gram."""

    X: Tensor
    gram: Tensor
    bad: Tensor


def _check(X: Tensor, gram_of) -> _Checked:
    """A NaN or inf entry makes its column's diagonal Gram entry non-finite, so the Gram, needed anyway, is the
    check: no extra pass over the weights. Its rare bad heads (entries non-finite, or too large for the dtype:
    their squares overflow) are zeroed and the Gram recomputed, so no decomposition sees them."""
    gram = gram_of(X)
    bad = ~torch.isfinite(trace(gram))
    if bool(bad.any()):
        X = torch.where(bad.view(-1, 1, 1), torch.zeros((), dtype=X.dtype, device=X.device), X)  # (n, 1, 1)
        gram = gram_of(X)
    return _Checked(X, gram, bad)
