"""The OV circuit W_OV = W_V W_O (Dk x D) of each head, from d_v x d_v products.

- singular values: those of R_V R_Oᵀ, where R_V and R_O are roots of W_VᵀW_V and W_O W_Oᵀ;
- effective rank (Roy & Vetterli) and spectral norm of W_OV;
- copying score Re Σλ / Σ|λ| of W_OV's eigenvalues (= those of W_O W_V, d_v x d_v): Elhage et al. 2021 score
  the full circuit W_U W_OV W_E through the vocabulary; without embeddings we score W_OV on the residual stream.
All NaN for a layer without W_O; the copying score also where Dk != D.
"""

from __future__ import annotations

from torch import Tensor

from qkinspect.metrics.factored import trace
from qkinspect.metrics.products import HeadProducts
from qkinspect.metrics.spectrum import effective_rank, eig_real_ratio


def ov_effective_rank(p: HeadProducts) -> Tensor:
    return p.nan() if not p.has_o else effective_rank(p.sigma_ov)


def ov_norm_spec(p: HeadProducts) -> Tensor:
    return p.nan() if not p.has_o else p.sigma_ov[:, 0]


def ov_copying(p: HeadProducts) -> Tensor:
    if not p.has_o or p.shape("O")[-1] != p.shape("V")[-2]:
        return p.nan()
    return eig_real_ratio(p.eig_ov, trace(p.c_ov))
