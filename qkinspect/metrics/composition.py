"""Composition scores between heads (Elhage et al. 2021), from the factors (ARCHITECTURE.md §3, "Heads together").

Row vectors: a head reads x and writes x W_V W_O; its scores are q W_Q W_Kᵀ kᵀ. For an earlier head a and a later
head b, with W_OV = W_V W_O and W_QK = W_Q W_Kᵀ (each d_model x d_model, never formed here):

    q:  ‖W_OV^a W_QK^b‖_F / (‖W_OV^a‖_F ‖W_QK^b‖_F)     (a writes what b's queries read)
    k:  ‖W_OV^a W_QK^bᵀ‖_F / (‖W_OV^a‖_F ‖W_QK^b‖_F)    (... b's keys read)
    v:  ‖W_OV^a W_OV^b‖_F / (‖W_OV^a‖_F ‖W_OV^b‖_F)     (... b's values read)

Every Frobenius norm here is ‖X F Yᵀ‖_F with tall factors X, Y, and ‖X F Yᵀ‖_F = ‖R_X F R_Yᵀ‖_F for any roots
with R_XᵀR_X = XᵀX (the R of X = QR is one). So each head is reduced once to small factors:

    earlier head a:  A_a   = R(W_V^a) W_O^a                 (dv x D)    ‖A_a‖_F = ‖W_OV^a‖_F
    later head b:    B_b^q = W_Q^b R(W_K^b)ᵀ                (D x d)     ‖B_b^q‖_F = ‖W_QK^b‖_F
                     B_b^k = W_K^b R(W_Q^b)ᵀ                (Dk x d)    ‖B_b^k‖_F = ‖W_QK^b‖_F
                     B_b^v = W_V^b R(W_O^bᵀ)ᵀ               (Dk x dv)   ‖B_b^v‖_F = ‖W_OV^b‖_F

and the numerator of every score is ‖A_a B_b‖_F: for all heads of two layers, one product
[H_a r, D] x [D, H_b r] and a sum of squares over its r x r blocks. That product is the whole cost (the floor:
(L H d_head)² D / 2 multiply-adds per kind for every pair of layers); the QR factors cost O(D d_head²) per head.

Numerics: the roots R come from float64 Grams (a d_head x d_head Gram and its Cholesky factor per head: O(D d_head²),
nothing beside the pair products); the reduced factors and the products are formed in the compute dtype, so the
only rounding in the default float32 is that of those products: a relative error of order √d_head · eps(float32)
on each score, far below 1e-4 (tests/metrics/test_composition.py checks float32 against a dense float64
reference; on SmolLM2 the worst of 105,705 scores is 1.4e-6 from float64).

The null (docs/composition.md derives it): for Gaussian factors of any shapes E[score²] = 1 / D exactly, D the
width of the residual stream a writes and b reads; `null_score` is its root, 1/√D.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from qkinspect.layer import AttentionLayer
from qkinspect.metrics.factored import one_thread

KINDS = ("q", "k", "v")


GRAM_CHUNK = 8  # heads whose float64 copy is held at once while their Grams are formed (32 MB for 4096 x 128)


def r_factor(X: Tensor, gain: Tensor | None = None) -> Tensor:
    """(n, m, k) -> (n, k, k): a root R of the Gram, RᵀR = XᵀX, in float64; of (diag(gain) X) with `gain` (m,).

    From the Cholesky factor of the float64 Gram (a Gram squares the condition number: in float64 that leaves
    1e-16 κ², below 1e-8 for any head with κ < 10⁴ — and the score, a Frobenius norm, is no more sensitive to
    it than the norms themselves); a Gram that is not positive definite (a zero or rank-deficient head) takes the
    root from its eigendecomposition, R = diag(√max(λ, 0)) Uᵀ. A head whose Gram is not finite (NaN or inf
    weights) gets a NaN root, so every score it takes part in is NaN. (Householder QR gives R directly but took six
    times as long on this machine's LAPACK for 576 x 64 heads.) The float64 copies are made GRAM_CHUNK heads at a
    time.
    """
    g = None if gain is None else gain.to(device=X.device, dtype=torch.float64)[:, None]  # (m, 1)
    G = torch.cat([(x := _scaled(X[i:i + GRAM_CHUNK].to(torch.float64), g)).mT @ x  # (chunk, k, k)
                   for i in range(0, X.shape[0], GRAM_CHUNK)])
    finite = torch.isfinite(G).all(dim=(-2, -1))  # (n,): a NaN or inf entry (or an overflow) spoils its head's Gram
    L, info = torch.linalg.cholesky_ex(torch.where(finite[:, None, None], G, torch.eye(G.shape[-1]).to(G)))
    R = L.mT
    bad = (info != 0) & finite
    if bool(bad.any()):
        lam, U = torch.linalg.eigh(G[bad])  # (b, k), (b, k, k)
        R = R.clone()
        R[bad] = lam.clamp_min(0).sqrt()[..., None] * U.mT  # diag(√λ) Uᵀ
    return R.masked_fill(~finite[:, None, None], float("nan"))  # a non-finite head's scores are NaN, never a crash


def _scaled(x: Tensor, g: Tensor | None) -> Tensor:
    """diag(g) x for each head of x (n, m, k), g (m, 1), as a new tensor (x may be the caller's); x when g is None."""
    return x if g is None else x * g


def grouped(W: Tensor, R: Tensor) -> Tensor:
    """Each query head's product W[g(h)] R[h]ᵀ without repeating W: W (G, m, k) (one per key/value head), R (H, r, k)
    (one per query head, heads of a group adjacent: g(h) = h // (H / G)) -> (H, m, r)."""
    G, H = W.shape[0], R.shape[0]
    out = torch.matmul(W[:, None], R.view(G, H // G, *R.shape[1:]).mT)  # (G, 1, m, k) @ (G, rep, k, r)
    return out.reshape(H, W.shape[1], R.shape[1])


def null_score(width: int) -> float:
    """The root-mean-square composition score of Gaussian factors written into and read from a stream of `width`
    dimensions: E[score²] = 1/width exactly, whatever the head widths (docs/composition.md)."""
    return 1.0 / math.sqrt(width)


@dataclass(frozen=True)
class WriteSide:
    """An earlier layer's heads reduced to A_h = R(W_V^{g(h)}) W_O^h.

    A: (H * r, D) in the compute dtype, head h's rows at [h r, (h + 1) r); norm: (H,) float64, ‖W_OV^h‖_F.
    """

    A: Tensor
    norm: Tensor
    n_heads: int

    @property
    def rows(self) -> int:
        return self.A.shape[0] // self.n_heads


@dataclass(frozen=True)
class ReadSide:
    """A later layer's heads reduced, per kind, to B: (D_in, H * r) in the compute dtype (head h's columns at
    [h r, (h + 1) r)), and norm: (H,) float64 (‖W_QK^h‖_F for q and k, ‖W_OV^h‖_F for v)."""

    B: dict[str, Tensor]
    norm: dict[str, Tensor]
    n_heads: int


def write_side(layer: AttentionLayer, dtype: torch.dtype = torch.float32, gain_kv: Tensor | None = None
               ) -> WriteSide:
    """The reduced write factors of every head of `layer` (which must have W_O), on one thread (small products).
    `gain_kv` (Dk,): the gain of the norm before the value projection, folded in as diag(gain) W_V.

    Example:
        >>> w = write_side(layer)  # doctest: +SKIP
        >>> w.A.shape  # (H * d_head_v, d_model)  # doctest: +SKIP
    """
    if layer.W_O is None:
        raise ValueError(f"{layer.block} layer {layer.layer} has no W_O: it writes nothing to compose")
    with one_thread():
        return _write_side(layer, dtype, gain_kv)


def _write_side(layer: AttentionLayer, dtype: torch.dtype, gain_kv: Tensor | None) -> WriteSide:
    kv = layer.kv_index()
    W_O = layer.W_O.to(dtype)
    R_V = r_factor(layer.W_V, gain_kv)[kv].to(dtype)  # (H, r, dv): each query head's value head, h // (H / G)
    A = torch.matmul(R_V, W_O)  # (H, r, dv) @ (H, dv, D) -> (H, r, D)
    norm = torch.linalg.matrix_norm(A).to(torch.float64)  # (H,)
    return WriteSide(A.reshape(-1, A.shape[-1]), norm, layer.spec.n_heads)  # (H r, D)


def read_side(layer: AttentionLayer, kinds: tuple[str, ...] = KINDS, dtype: torch.dtype = torch.float32,
              gain_q: Tensor | None = None, gain_kv: Tensor | None = None) -> ReadSide:
    """The reduced read factors of every head of `layer` for each of `kinds` ("v" needs W_O), on one thread.
    `gain_q` (D,), `gain_kv` (Dk,): the gains of the norms before the query and the key/value projections, folded in
    as diag(gain) W_Q, diag(gain) W_K, diag(gain) W_V (as `qkinspect.metrics.fold.fold_ln` folds them), here inside
    the products: no folded copy of the weights is made.

    Example:
        >>> b = read_side(layer, ("q",))  # doctest: +SKIP
        >>> b.B["q"].shape  # (d_model, H * d_head)  # doctest: +SKIP
    """
    with one_thread():
        return _read_side(layer, kinds, dtype, gain_q, gain_kv)


def _read_side(layer: AttentionLayer, kinds: tuple[str, ...], dtype: torch.dtype, gain_q: Tensor | None,
               gain_kv: Tensor | None) -> ReadSide:
    kv = layer.kv_index()
    if "v" in kinds and layer.W_O is None:
        raise ValueError(f"{layer.block} layer {layer.layer} has no W_O: no V-composition into it")
    cols: dict[str, Tensor] = {}
    norms: dict[str, Tensor] = {}
    for kind in kinds:  # one kind at a time, in the compute dtype: one (H, D, r) operand made at a time
        if kind == "q":  # (H, D, d) @ (H, d, r) -> (H, D, r)
            b = torch.matmul(layer.W_Q.to(dtype), r_factor(layer.W_K, gain_kv)[kv].to(dtype).mT)
            rows = gain_q
        elif kind == "k":  # W_K of each query head's key/value head, R of its own W_Q
            b = grouped(layer.W_K.to(dtype), r_factor(layer.W_Q, gain_q).to(dtype))
            rows = gain_kv
        else:  # W_V of the key/value head, R of the head's own W_Oᵀ (H, D, dv)
            b = grouped(layer.W_V.to(dtype), r_factor(layer.W_O.mT).to(dtype))
            rows = gain_kv
        if rows is not None:
            b.mul_(rows.to(b)[:, None])  # diag(gain) (W R): the gain on the rows, in place

        norms[kind] = torch.linalg.matrix_norm(b).to(torch.float64)
        cols[kind] = b.permute(1, 0, 2).reshape(b.shape[1], -1)  # (H, D_in, r) -> (D_in, H r)
        del b
    return ReadSide(cols, norms, layer.spec.n_heads)


def product_norms(A: Tensor, B: Tensor, n_from: int, n_to: int) -> Tensor:
    """‖A_a B_b‖_F for every block pair: A (n_from r_a, D), B (D, n_to r_b) -> (n_from, n_to) float64.

    One product (on all of torch's threads), squared in place, then summed over each r_a x r_b block: first down
    the r_a rows (contiguous rows added), then across each head's r_b columns, on one thread (memory-bound passes:
    on a busy machine, threads waiting at each pass's barrier cost more than they bring).
    """
    P = A @ B  # (n_from r_a, n_to r_b)
    r_a, r_b = P.shape[0] // n_from, P.shape[1] // n_to
    with one_thread():
        rows = P.square_().view(n_from, r_a, n_to * r_b).sum(dim=1)  # (n_from, n_to r_b)
        return rows.view(n_from, n_to, r_b).sum(dim=-1).to(torch.float64).sqrt_()


def scores(write: WriteSide, read: ReadSide, kind: str) -> Tensor:
    """The (H_a, H_b) float64 scores of one kind between every head of an earlier and of a later layer."""
    num = product_norms(write.A, read.B[kind], write.n_heads, read.n_heads)
    return normalised(num, write.norm, read.norm[kind])


def normalised(numerators: Tensor, norm_a: Tensor, norm_b: Tensor) -> Tensor:
    """‖A_a B_b‖_F (H_a, H_b) divided by ‖A_a‖_F ‖B_b‖_F; NaN where a head has a zero or non-finite norm."""
    denom = norm_a.to(numerators)[:, None] * norm_b.to(numerators)[None, :]  # (H_a, 1) * (1, H_b)
    out = numerators / denom
    return out.masked_fill(~torch.isfinite(out) | (denom == 0), float("nan"))
