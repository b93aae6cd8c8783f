"""Scalar summaries of a spectrum, batched: singular values (n, k) descending, eigenvalues (n, k) complex.

All return (n,) tensors; a zero spectrum gives NaN (0/0), never an exception.
"""

from __future__ import annotations

import torch
from torch import Tensor


def effective_rank(sigma: Tensor) -> Tensor:
    """Roy & Vetterli (2007): exp of the entropy of p_i = σ_i / Σσ, in [1, k].

    Example:
        >>> effective_rank(torch.tensor([[1.0, 1.0, 0.0]])).item()
        2.0
    """
    p = sigma / sigma.sum(-1, keepdim=True)
    plogp = torch.where(p > 0, p * p.clamp_min(torch.finfo(p.dtype).tiny).log(), torch.zeros_like(p))
    ent = -plogp.sum(-1)
    return torch.where(sigma.sum(-1) > 0, ent.exp(), torch.full_like(ent, float("nan")))


def stable_rank(sigma: Tensor) -> Tensor:
    """||M||_F² / σ_1², in [1, k]."""
    return (sigma**2).sum(-1) / sigma[..., 0] ** 2


def participation_ratio(sigma: Tensor) -> Tensor:
    """(Σσ²)² / Σσ⁴, in [1, k]."""
    s2 = sigma**2
    return s2.sum(-1) ** 2 / (s2**2).sum(-1)


def energy_rank(sigma: Tensor, fraction: float = 0.9) -> Tensor:
    """Smallest k with Σ_{i<=k} σ_i² >= fraction · Σσ² (k90 for fraction 0.9); NaN for a zero spectrum."""
    s2 = sigma**2
    total = s2.sum(-1, keepdim=True)
    reached = s2.cumsum(-1) >= fraction * total  # (n, k)
    k = reached.to(torch.int64).argmax(-1) + 1  # first True
    return torch.where(total.squeeze(-1) > 0, k.to(sigma.dtype), torch.full_like(total.squeeze(-1), float("nan")))


EIG_RTOL = 1e-3


def _eig_tol(eig: Tensor) -> Tensor:
    """Eigenvalues with |λ| (or Re λ) at or below EIG_RTOL · max|λ| do not count. The cut is the same in float32
    and float64 and well above float32's rounding (and the O(sqrt(eps)) spread of a defective zero eigenvalue):
    trained heads have eigenvalues spread over many decades, and counting the tiny ones would make the fraction
    depend on the precision (it did, by 0.13, on SmolLM2 with a sqrt(eps) cut)."""
    return EIG_RTOL * eig.abs().amax(-1, keepdim=True)


def eig_positive_fraction(eig: Tensor) -> Tensor:
    """Among the eigenvalues with |λ| > 1e-3 · max|λ|, the fraction with Re λ > 1e-3 · max|λ| (a purely
    imaginary pair, as in a skew-symmetric form, counts as not positive)."""
    tol = _eig_tol(eig)
    nonzero = eig.abs() > tol
    positive = eig.real > tol
    return positive.sum(-1).to(eig.real.dtype) / nonzero.sum(-1).to(eig.real.dtype)


def eig_real_ratio(eig: Tensor, trace: Tensor | None = None) -> Tensor:
    """Re Σλ / Σ|λ| in [-1, 1]: 1 for a positive semi-definite form, -1 for a negative one, 0 for a rotation.

    `trace` (= Re Σλ exactly) may be passed to avoid summing eigenvalue rounding errors.
    """
    num = eig.real.sum(-1) if trace is None else trace
    return num / eig.abs().sum(-1)


def descending_eigvals(eig: Tensor) -> Tensor:
    """Eigenvalues sorted by decreasing modulus (n, k)."""
    order = torch.sort(eig.abs(), dim=-1, descending=True, stable=True).indices
    return eig.gather(-1, order)
