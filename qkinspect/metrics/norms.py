"""Norms of a head's matrices and biases. Norms of W_Q, W_K, W_V and the biases change under a re-basing of the
head (only orthogonal ones keep them); the norms of M = W_Q W_Kᵀ do not."""

from __future__ import annotations

from torch import Tensor

from qkinspect.metrics.products import HeadProducts


def norm_q_fro(p: HeadProducts) -> Tensor:
    return p.fq.fro2().sqrt()


def norm_k_fro(p: HeadProducts) -> Tensor:
    return p.fk.fro2().sqrt()


def norm_v_fro(p: HeadProducts) -> Tensor:
    return p.fv.fro2().sqrt()


def norm_qk_fro(p: HeadProducts) -> Tensor:
    return p.fro2_qk.clamp_min(0).sqrt()


def norm_q_spec(p: HeadProducts) -> Tensor:
    return p.fq.sigma[:, 0]


def norm_k_spec(p: HeadProducts) -> Tensor:
    return p.fk.sigma[:, 0]


def norm_v_spec(p: HeadProducts) -> Tensor:
    return p.fv.sigma[:, 0]


def norm_qk_spec(p: HeadProducts) -> Tensor:
    return p.sigma_qk[:, 0]


def _bias_norm(p: HeadProducts, b: Tensor | None, per_kv: bool) -> Tensor:
    """||b|| per query head (n,); NaN when the checkpoint has no such bias."""
    if b is None:
        return p.nan()
    b = b[p.kv] if per_kv else b
    return b.norm(dim=-1)


def bias_q_norm(p: HeadProducts) -> Tensor:
    return _bias_norm(p, p.b_Q, per_kv=False)


def bias_k_norm(p: HeadProducts) -> Tensor:
    return _bias_norm(p, p.b_K, per_kv=True)


def bias_v_norm(p: HeadProducts) -> Tensor:
    return _bias_norm(p, p.b_V, per_kv=True)
