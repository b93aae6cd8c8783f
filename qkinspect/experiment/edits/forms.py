"""The edits on one block of factors, from (2k x 2k) products only (docs/experiments.md, "Edits").

A block is a batch of factor pairs A, B (..., D, k), real or complex, whose bilinear form is P = A Bᴴ, and the
query and key biases as one more row of each factor (..., 1, k). With X = [A B] = Q R (QR, Q orthonormal
(D, m), m = min(D, 2k)), A = Q R_a and B = Q R_b, so P = Q (R_a R_bᴴ) Qᴴ: every edit below works on the m x m
matrix R_a R_bᴴ and writes its new factors as Q times new coordinates, so a head costs O(D k²) and the distance
||P' − P||_F is read exactly in the small frame, with no cancellation.

The only bias term softmax sees is the key-side one, b_Q Bᴴ x_j (terms constant along a query's row cancel), so
after an edit the query bias is refitted by least squares to keep b_Q Bᴴ, and the key bias follows the edit's form.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Block:
    """Factors A, B (..., D, k) and bias rows bq, bk (..., 1, k) (zeros where the layer has none)."""

    A: Tensor
    B: Tensor
    bq: Tensor
    bk: Tensor


@dataclass(frozen=True)
class Edited:
    """New factors and biases, and ||P' − P||_F² and ||P||_F² per block (...,)."""

    block: Block
    off2: Tensor
    tot2: Tensor


def _fro2(X: Tensor) -> Tensor:
    return X.abs().square().sum((-2, -1))


def _frame(blk: Block) -> tuple[Tensor, Tensor, Tensor]:
    """Q (..., D, m), R_a and R_b (..., m, k) with A = Q R_a, B = Q R_b."""
    k = blk.A.shape[-1]
    Q, R = torch.linalg.qr(torch.cat([blk.A, blk.B], -1))  # (..., D, 2k) -> (..., D, m), (..., m, 2k)
    return Q, R[..., :k], R[..., k:]


def _pad(X: Tensor, k: int) -> Tensor:
    """Zero columns up to k (a frame narrower than the head: D < k)."""
    return X if X.shape[-1] == k else torch.cat([X, X.new_zeros(*X.shape[:-1], k - X.shape[-1])], -1)


def _refit_bq(bq: Tensor, Rb: Tensor, b_new: Tensor) -> Tensor:
    """Least-squares b' with b' b_newᴴ ≈ bq R_bᴴ: the key-side bias term kept as well as the new keys allow."""
    return (bq @ Rb.mH) @ torch.linalg.pinv(b_new.mH)  # (..., 1, m) @ (..., m, k) -> (..., 1, k)


def _hermitian_part(Ra: Tensor, Rb: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """P = R_a R_bᴴ, and the eigenvalues (ascending) and eigenvectors of (P + Pᴴ)/2."""
    P = Ra @ Rb.mH  # (..., m, k) @ (..., k, m)
    lam, E = torch.linalg.eigh((P + P.mH) / 2)
    return P, lam, E


def _done(Q: Tensor, P: Tensor, a: Tensor, b: Tensor, bq: Tensor, bk: Tensor) -> Edited:
    return Edited(Block(Q @ a, Q @ b, bq, bk), _fro2(a @ b.mH - P), _fro2(P))


def share_qk(blk: Block) -> Edited:
    """W Wᴴ nearest to P: the PSD part of its Hermitian part (at most k positive eigenvalues), W = E √λ₊."""
    k = blk.A.shape[-1]
    Q, Ra, Rb = _frame(blk)
    P, lam, E = _hermitian_part(Ra, Rb)
    top = min(k, lam.shape[-1])
    w = _pad(E[..., -top:] * lam[..., -top:].clamp_min(0).sqrt().unsqueeze(-2).to(E.dtype), k)  # (..., m, k)
    bq = _refit_bq(blk.bq, Rb, w)
    return _done(Q, P, w, w, bq, bq)


def symmetric(blk: Block) -> Edited:
    """Best rank <= k approximation of P's Hermitian part: the k eigenvalues largest in modulus,
    factored as W_Q' = E |λ|^½, W_K' = E sign(λ) |λ|^½."""
    k = blk.A.shape[-1]
    Q, Ra, Rb = _frame(blk)
    P, lam, E = _hermitian_part(Ra, Rb)
    idx = lam.abs().topk(min(k, lam.shape[-1]), -1).indices  # (..., top)
    lam = lam.gather(-1, idx)
    E = E.gather(-1, idx.unsqueeze(-2).expand(*E.shape[:-1], idx.shape[-1]))
    sign = _pad(torch.where(lam < 0, -1.0, 1.0).to(lam.dtype), k).unsqueeze(-2)  # (..., 1, k)
    a = _pad(E * lam.abs().sqrt().unsqueeze(-2).to(E.dtype), k)
    b = a * sign
    bq = _refit_bq(blk.bq, Rb, b)
    return _done(Q, P, a, b, bq, bq * sign)


def tie(blk: Block, keep: str) -> Edited:
    """The naive tie in the stored basis: both factors (and biases) become the query's ("q") or the key's ("k")."""
    _, Ra, Rb = _frame(blk)
    if keep == "q":  # P' = R_a R_aᴴ
        new, change = Block(blk.A, blk.A, blk.bq, blk.bq), Ra @ (Ra - Rb).mH
    else:  # P' = R_b R_bᴴ
        new, change = Block(blk.B, blk.B, blk.bk, blk.bk), (Rb - Ra) @ Rb.mH
    return Edited(new, _fro2(change), _fro2(Ra @ Rb.mH))


@dataclass(frozen=True)
class Spectrum:
    """A separate-QR frame for rank truncation: A = Q_a R_a, B = Q_b R_b, R_a R_bᴴ = U diag(S) Vᴴ."""

    Qa: Tensor
    Ra: Tensor
    U: Tensor
    S: Tensor  # (..., m) descending


def spectrum(A: Tensor, B: Tensor) -> Spectrum:
    """The singular values of A Bᴴ from the factors (A and B may have different row counts)."""
    Qa, Ra = torch.linalg.qr(A)  # (..., D, k), (..., k, k)
    _, Rb = torch.linalg.qr(B)
    U, S, _ = torch.linalg.svd(Ra @ Rb.mH)
    return Spectrum(Qa, Ra, U, S)


def truncate(sp: Spectrum, keep: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """New query factor Q_a U_K U_Kᴴ R_a (M truncated to its top `keep` (...,) singular values: only the query
    side changes, M_K = U_K U_Kᴴ M), with ||ΔM||² and ||M||²."""
    kept = (torch.arange(sp.S.shape[-1]) < keep.unsqueeze(-1)).to(sp.S.dtype)  # (..., m)
    Uk = sp.U * kept.unsqueeze(-2).to(sp.U.dtype)
    A = sp.Qa @ (Uk @ (Uk.mH @ sp.Ra))
    S2 = sp.S.square()
    return A, (S2 * (1 - kept)).sum(-1), S2.sum(-1)
