"""How alike the query, key and value maps of a head are: subspace overlap, entry-wise cosine, linear CKA.

For a pair (A, B) of tall factors with the same number of rows, from their Gram factors and the cross product BᵀA:
- subspace overlap: mean cos² of the principal angles between the column spaces, ||U_Aᵀ U_B||_F² / min(rank A,
  rank B) (= ||U_Aᵀ U_B||_F² / d_head for full-rank heads), in [0, 1]; invariant to any invertible re-basing.
- entry-wise cosine: ⟨A, B⟩_F / (||A||_F ||B||_F), in [-1, 1]; needs equal shapes; depends on the basis.
- linear CKA (Kornblith et al. 2019), rows as samples, centred: ||A_cᵀ B_c||_F² / (||A_cᵀ A_c||_F ||B_cᵀ B_c||_F),
  in [0, 1]; invariant to orthogonal transforms and scaling of either side, not to general ones.
Q-vs-K and Q-vs-V need the query and key/value inputs to be the same space (D == Dk): NaN otherwise.
"""

from __future__ import annotations

import torch
from torch import Tensor

from qkinspect.metrics.factored import GramFactor, trace
from qkinspect.metrics.products import HeadProducts


def subspace_overlap(fa: GramFactor, fb: GramFactor, cross: Tensor) -> Tensor:
    """Mean cos² of principal angles between col(A) and col(B), from cross = BᵀA (n, db, da) -> (n,)."""
    T = fb.whitener.mT @ cross @ fa.whitener  # U_Bᵀ U_A: (n, db, db) @ (n, db, da) @ (n, da, da)
    k = torch.minimum(fa.rank, fb.rank).to(T.dtype)
    return _fro2(T) / k  # k = 0 (a zero head): NaN


def entrywise_cosine(fa: GramFactor, fb: GramFactor, cross: Tensor) -> Tensor:
    """⟨A, B⟩_F / (||A|| ||B||) = tr(BᵀA) / sqrt(tr AᵀA · tr BᵀB) for equal shapes."""
    return trace(cross) / (fa.fro2() * fb.fro2()).sqrt()


def linear_cka(fa: GramFactor, fb: GramFactor, cross: Tensor, mean_a: Tensor, mean_b: Tensor, rows: int) -> Tensor:
    """Centred linear CKA with rows as samples, from Grams, cross = BᵀA and column means (n, da), (n, db)."""
    cc = _centred(cross, mean_b, mean_a, rows)  # B_cᵀ A_c (n, db, da)
    ga, gb = _centred(fa.gram, mean_a, mean_a, rows), _centred(fb.gram, mean_b, mean_b, rows)  # A_cᵀ A_c, B_cᵀ B_c
    fro = torch.linalg.matrix_norm  # not the squares' product: (||A_cᵀA_c|| ||B_cᵀB_c||)² can overflow float32
    return _fro2(cc) / (fro(ga) * fro(gb))


def _centred(P: Tensor, u: Tensor, v: Tensor, rows: int) -> Tensor:
    """P - rows · u vᵀ per head, (n, a, b) from u (n, a), v (n, b): one fused product, no outer-product temporary."""
    return torch.baddbmm(P, u.unsqueeze(-1), v.unsqueeze(-2), alpha=-rows)


def _fro2(A: Tensor) -> Tensor:
    """||A||_F² per head (n,) in one pass over A (n, a, b)."""
    return torch.linalg.vector_norm(A, dim=(-2, -1)).square()


def overlap_qk(p: HeadProducts) -> Tensor:
    return subspace_overlap(p.fq, p.fk, p.c_qk) if p.square else p.nan()


def overlap_qv(p: HeadProducts) -> Tensor:
    return subspace_overlap(p.fq, p.fv, p.c_qv) if p.square else p.nan()


def overlap_kv(p: HeadProducts) -> Tensor:
    return subspace_overlap(p.fk, p.fv, p.c_kv)


def cosine_qk(p: HeadProducts) -> Tensor:
    return entrywise_cosine(p.fq, p.fk, p.c_qk) if p.square else p.nan()


def cosine_qv(p: HeadProducts) -> Tensor:
    same_shape = p.square and p.shape("Q")[-1] == p.shape("V")[-1]
    return entrywise_cosine(p.fq, p.fv, p.c_qv) if same_shape else p.nan()


def cosine_kv(p: HeadProducts) -> Tensor:
    return entrywise_cosine(p.fk, p.fv, p.c_kv) if p.shape("K")[-1] == p.shape("V")[-1] else p.nan()


def cka_qk(p: HeadProducts) -> Tensor:
    if not p.square:
        return p.nan()
    mq, mk, _ = p.means
    return linear_cka(p.fq, p.fk, p.c_qk, mq, mk, p.shape("Q")[-2])


def cka_qv(p: HeadProducts) -> Tensor:
    if not p.square:
        return p.nan()
    mq, _, mv = p.means
    return linear_cka(p.fq, p.fv, p.c_qv, mq, mv, p.shape("Q")[-2])


def cka_kv(p: HeadProducts) -> Tensor:
    _, mk, mv = p.means
    return linear_cka(p.fk, p.fv, p.c_kv, mk, mv, p.shape("K")[-2])
