"""Symmetry and directionality of the bilinear form M = W_Q W_Kᵀ, per head, from d_head x d_head products.

symmetry s = ⟨M, Mᵀ⟩_F / ||M||_F² = tr((W_KᵀW_Q)²) / tr(W_QᵀW_Q · W_KᵀW_K), in [-1, 1]
(= (||M_sym||² - ||M_skew||²) / ||M||²: 1 symmetric, -1 skew-symmetric, about 0 for random factors).

shared-QK distance: the relative Frobenius distance from M to the nearest form queries and keys could produce with
one shared matrix, M' = W Wᵀ (Kitaev et al. 2020's shared-QK attention, up to the gauge): the symmetric positive
semi-definite matrices (of rank <= d_head, which the nearest one has anyway: M's symmetric part has at most d_head
positive eigenvalues). With λ_i the eigenvalues of (M + Mᵀ)/2, it is sqrt((||M_skew||² + Σ_{λ<0} λ²) / ||M||²)
in [0, 1]: 0 for a form one shared matrix can produce, 1 for a skew-symmetric or negative semi-definite one.

directionality (Saponati et al. 2025): with row norms r_i and column norms c_j of M, R = Σ max(r_i - (mean r
+ 2 std r), 0) and C likewise, (R - C) / (R + C) in [-1, 1]; negative = a few columns (keys) dominate.
"""

from __future__ import annotations

import torch
from torch import Tensor

from qkinspect.metrics.factored import tr_prod
from qkinspect.metrics.products import HeadProducts


def symmetry(p: HeadProducts) -> Tensor:
    """Symmetry score per head (n,); NaN where queries and keys read different spaces or M = 0.

    Example:
        >>> p = HeadProducts(layer)  # doctest: +SKIP
        >>> symmetry(p)  # doctest: +SKIP
        tensor([0.41, 0.57, ...])
    """
    if not p.square:
        return p.nan()
    num = tr_prod(p.c_qk, p.c_qk)  # tr(C C) = ⟨M, Mᵀ⟩ with C = W_Kᵀ W_Q
    return num / p.fro2_qk  # ||M||_F²


def shared_qk_distance(p: HeadProducts) -> Tensor:
    """Shared-QK distance per head (n,); 0 exactly where W_K is W_Q; NaN where D != Dk or M = 0.

    Example:
        >>> shared_qk_distance(HeadProducts(layer))  # doctest: +SKIP
        tensor([0.62, 0.55, ...])
    """
    if not p.square:
        return p.nan()
    total = p.fro2_qk  # ||M||_F²
    if p.same_qk:  # M = W_Q W_Qᵀ
        return torch.where(total > 0, torch.zeros_like(total), torch.full_like(total, float("nan")))
    lam, skew2 = p.sym_skew_qk
    off = skew2 + lam.clamp_max(0).square().sum(-1)  # ||M − M'||² for the nearest M'
    return (off / total).clamp(0, 1).sqrt()


def outlier_excess(norms: Tensor, num_std: float = 2.0) -> Tensor:
    """Σ max(x_i - (mean x + num_std · std x), 0) over the last dim (std with Bessel's correction, as in
    Saponati et al.'s code)."""
    threshold = norms.mean(-1, keepdim=True) + num_std * norms.std(-1, keepdim=True)
    return (norms - threshold).clamp_min(0).sum(-1)


def directionality_from_norms(rows: Tensor, cols: Tensor) -> Tensor:
    """(R - C) / (R + C) from row norms (n, D) and column norms (n, Dk); 0 when neither has outliers,
    NaN for a zero form."""
    R, C = outlier_excess(rows), outlier_excess(cols)
    total = R + C
    out = torch.where(total > 0, (R - C) / total.clamp_min(torch.finfo(total.dtype).tiny), torch.zeros_like(total))
    return torch.where(rows.amax(-1) > 0, out, torch.full_like(out, float("nan")))


def directionality(p: HeadProducts) -> Tensor:
    """Directionality per head (n,), from the row and column norms of M computed without forming M."""
    rows, cols = p.row_col_norms
    return directionality_from_norms(rows, cols)
