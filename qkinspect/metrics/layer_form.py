"""Per-layer quantities: the summed form M_layer = Σ_h W_Q^h W_K^g(h)ᵀ (opt-in, O(D³): the one place a
d_model x d_model matrix is formed) and the head-by-head overlap of query-side column spaces."""

from __future__ import annotations

import torch
from torch import Tensor

from qkinspect.metrics.products import HeadProducts
from qkinspect.metrics.symmetry import directionality_from_norms


def summed_form(Q: Tensor, K: Tensor, kv: Tensor) -> Tensor:
    """M_layer (D, Dk) from Q (H, D, d), K (G, Dk, d) and each query head's KV head kv (H,)."""
    H, D, d = Q.shape
    A = Q.permute(1, 0, 2).reshape(D, H * d)  # (H, D, d) -> (D, H, d) -> (D, H*d)
    B = K[kv].permute(1, 0, 2).reshape(K.shape[1], H * d)  # (H, Dk, d) -> (Dk, H, d) -> (Dk, H*d)
    return A @ B.T  # Σ_h A_h B_hᵀ


def layer_form_metrics(Q: Tensor, K: Tensor, kv: Tensor) -> dict[str, float]:
    """symmetry_layer and directionality_layer of the summed form (NaN symmetry when D != Dk).

    Example:
        >>> Q = torch.randn(4, 16, 4, dtype=torch.float64)
        >>> layer_form_metrics(Q, Q, torch.arange(4))["symmetry_layer"]
        1.0
    """
    M = summed_form(Q, K, kv)
    fro2 = (M * M).sum()
    sym = (M * M.T).sum() / fro2 if M.shape[0] == M.shape[1] else torch.tensor(float("nan"))  # M.T (Dk, D)
    rows = torch.linalg.vector_norm(M, dim=1)  # (D,)
    cols = torch.linalg.vector_norm(M, dim=0)  # (Dk,)
    direc = directionality_from_norms(rows.unsqueeze(0), cols.unsqueeze(0))[0]
    return {"symmetry_layer": float(sym), "directionality_layer": float(direc)}


def head_overlap(p: HeadProducts) -> Tensor:
    """(n, n): mean cos² of the principal angles between the column spaces of W_Q of heads i and j
    (1 on the diagonal; NaN for a zero head). Costs O(n² D d²)."""
    n, D, d = p.Q.shape
    U = p.Q @ p.fq.whitener  # orthonormal bases, zero-padded: (n, D, d)
    U = U.permute(1, 0, 2).reshape(D, n * d)  # (n, D, d) -> (D, n, d) -> (D, n*d)
    P = (U.T @ U).reshape(n, d, n, d)  # (n*d, n*d) -> (n, d, n, d): block (i, j) = U_iᵀ U_j
    k = torch.minimum(p.fq.rank.unsqueeze(1), p.fq.rank.unsqueeze(0)).to(P.dtype)  # (n, n)
    return (P**2).sum((1, 3)) / k
