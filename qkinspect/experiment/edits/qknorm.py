"""Edits through q/k norms (docs/experiments.md, "Edits under q/k norms").

A q/k-normed head (Qwen3, Gemma 3, OLMo2) scores `q̂ · k̂` with `q̂ = g_q ⊙ q / rms(q)`, `q = x W_Q + b_Q`, and `k̂`
likewise. With `c = g_q ⊙ g_k` and `u(x) = q / rms(q)`, the unrotated score is `u_q(x) diag(c) u_k(y)ᵀ`: the
folded form `M_f = Ŵ_Q diag(c) Ŵ_Kᵀ` (`Ŵ = [W; b]`, the bias one more input row) divided by the two projections'
RMS. Whatever `W` is, `W_Q' = W_K' = W` (and `b_Q' = b_K'`) makes the norms see one projection, so the score is
`u(x) diag(c) u(y)ᵀ`: symmetric, whatever the gains, which stay the model's own (they are one vector shared by
every head in Qwen3 and Gemma 3). Flipping the signs of some of its columns on one side, `W_K' = W diag(s)`,
changes no RMS and keeps the score symmetric too.

- share_qk: `W_Q' = W_K' = W`. The folded forms `W diag(c) Wᵀ` are the symmetric matrices with at most `p`
  positive and `n` negative eigenvalues (`p`, `n` the counts of positive and negative `c_i`); the nearest to `M_f`
  keeps the `p` largest positive and `n` most negative eigenvalues `λ` of `M_f`'s symmetric part (Hoffman-Wielandt).
  Eigenvalue `λ_j` with eigenvector `e_j` becomes column `i` of `W`, `W[:, i] = e_j √(λ_j / c_i)`, with `c_i` of
  `λ_j`'s sign, the largest `|λ|` on the largest `|c|` (any pairing gives the same folded form); columns left
  over (`c_i = 0`, or fewer eigenvalues of that sign) are 0.
- symmetric: `W_Q' = W`, `W_K' = W diag(s)`: any symmetric folded form of rank <= #{c_i != 0}; the nearest keeps the
  eigenvalues largest in modulus, `W[:, i] = e_j √(|λ_j| / |c_i|)`, `s_i = sign(λ_j c_i)`.
- rank:K: the runner's rank edit on the folded factors (`W_Q diag(g_q)`, `W_K diag(g_k)`), then unfolded:
  `W_Q' = A' diag(g_q)⁻¹` (columns where `g_q = 0` are invisible to the scores and kept).

All three are built on the unrotated (offset-0) form; rank:K keeps whole rotary pairs as without norms.
"""

from __future__ import annotations

import torch
from torch import Tensor

from qkinspect.experiment.edits.names import Edit, EditError
from qkinspect.layer import AttentionLayer

F64 = torch.float64
ONE_MATRIX = ("share_qk", "symmetric", "share_qkv")  # one projection for queries and keys (up to column signs)
DEFINED = (*ONE_MATRIX, "rank")


def normed(layer: AttentionLayer) -> bool:
    """Whether the layer's q and k pass through norms after the projections."""
    return bool(layer.spec.qk_norm or layer.q_norm is not None or layer.k_norm is not None)


def check(layer: AttentionLayer, edit: Edit, idx: list[int]) -> None:
    """Refuse, in one line that says why, what cannot be defined through this layer's q/k norms. What the norms'
    form decides (`check_form`) is refused from the model's description before it is loaded
    (`qkinspect.experiment.requests.check_model`); it is checked here again, on the layer as read."""
    name, where = edit.name, f"{layer.block} layer {layer.layer}"
    if name not in DEFINED or not normed(layer):
        return
    if layer.q_norm is None or layer.k_norm is None:
        raise EditError(f"{where}: {name} under q/k norms needs both norms' gains, and this layer's adapter "
                        "gives only one")
    check_form(where, name, layer.extra.get("qk_norm_kind", "rmsnorm"), layer.extra.get("qk_norm_scope", "head"),
               sorted(idx) == list(range(layer.spec.n_heads)))
    if name in ONE_MATRIX and (layer.b_Q is None) != (layer.b_K is None):
        raise EditError(f"{where}: {name} under q/k norms needs a query bias and a key bias or neither (the "
                        "bias is part of the projection the norm divides)")


def check_form(where: str, name: str, kind: str, scope: str, every_head: bool, together: str = "") -> None:
    """EditError for what the q/k norms' form cannot define for the edit `name`: a LayerNorm q/k norm (`kind`
    "layernorm"), or some heads only (`every_head` False) where the norm's RMS runs over the whole projection
    (`scope` "projection", OLMo2). `together` says how the caller edits every head at once (" (--scope layer)")."""
    if name not in DEFINED:
        return
    if kind != "rmsnorm":
        raise EditError(f"{where}: {name} is defined through RMSNorm q/k norms only; a LayerNorm q/k norm adds "
                        "its own bias after the projection, which one matrix for queries and keys cannot share")
    if scope == "projection" and not every_head:
        raise EditError(f"{where}: {name} on some heads only is not defined here: the q/k norm divides every "
                        "head's queries (and keys) by one RMS over the whole projection, so editing some heads "
                        "rescales the others' scores (and leaves share_qk's asymmetric); edit every head of the "
                        f"layer together{together}")


def per_head(gain: Tensor, rows: Tensor) -> Tensor:
    """A q/k-norm gain (d,) shared by the heads, or (n, d) per head, as (len(rows), d) float64."""
    g = gain.to(F64)
    return g.expand(len(rows), -1).clone() if g.dim() == 1 else g[rows].clone()


def gains(layer: AttentionLayer, idx: list[int]) -> tuple[Tensor, Tensor]:
    """g_q and g_k of query heads `idx` (n, d), each head with its key/value head's key gain."""
    h = torch.tensor(idx, dtype=torch.int64)
    return per_head(layer.q_norm, h), per_head(layer.k_norm, layer.kv_index()[h])


def _frame_sym(A: Tensor, B: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Q (n, R, m) and, in that frame, the folded form P = R_a diag(c) R_bᵀ (n, m, m) and the eigenvalues
    (ascending) and eigenvectors of its symmetric part."""
    d = A.shape[-1]
    Q, R = torch.linalg.qr(torch.cat([A, B], -1))  # (n, R, 2d) -> (n, R, m), (n, m, 2d)
    P = (R[..., :d] * c.unsqueeze(-2)) @ R[..., d:].mT  # (n, m, d) @ (n, d, m)
    lam, E = torch.linalg.eigh((P + P.mT) / 2)
    return Q, P, lam, E


def one_matrix(A: Tensor, B: Tensor, c: Tensor, name: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The share_qk (`name` "share_qk"/"share_qkv") or symmetric W for raw factors A, B (n, R, d) and gain
    products c (n, d) (folded form A diag(c) Bᵀ): returns W (n, R, d), the signs s (n, d) with W_K' = W diag(s),
    and ||M_f' − M_f||_F², ||M_f||_F² (n,) of the folded forms.

    Every W = F O |C|^-½ with F the placed eigenvectors and O orthogonal within each block of coordinates of one
    sign of c ⊙ s gives the same nearest folded form; O is the one that brings W closest to the mean of the two
    projections, min ||(W − (A + B diag(s))/2) |C|^½||_F (orthogonal Procrustes per block), so that a head whose
    keys are already its queries (B = α A, α > 0, c > 0) keeps its scores exactly (W = √α A)."""
    n, d = c.shape
    Q, P, lam, E = _frame_sym(A, B, c)
    Ra, Rb = Q.mT @ A, Q.mT @ B  # (n, m, d): the factors in the frame (exact: Q spans [A B])
    W = torch.zeros_like(Ra)
    s = torch.ones(n, d, dtype=F64)
    for i in range(n):
        F = torch.zeros_like(Ra[i])
        for j, col in _placement(lam[i], c[i], name):
            F[:, col] = E[i, :, j] * lam[i, j].abs().sqrt()
            if name == "symmetric" and float(lam[i, j] * c[i, col]) < 0:
                s[i, col] = -1.0
        root = c[i].abs().sqrt()
        target = (Ra[i] + Rb[i] * s[i]) / 2  # (m, d)
        sigma = torch.sign(c[i]) * s[i]  # the sign each coordinate gives its eigenvalue
        for b in (1.0, -1.0):
            cols = (sigma == b).nonzero().flatten()
            if len(cols):
                U, _, Vh = torch.linalg.svd(F[:, cols].mT @ (target[:, cols] * root[cols]))
                W[i][:, cols] = (F[:, cols] @ (U @ Vh)) / root[cols]
        free = c[i] == 0  # invisible to the scores, counted in the RMS: the mean of the two projections
        W[i][:, free] = target[:, free]
    new = (W * (c * s).unsqueeze(-2)) @ W.mT  # (n, m, m): W diag(c s) Wᵀ in the frame
    return Q @ W, s, (new - P).square().sum((-2, -1)), P.square().sum((-2, -1))


def _placement(lam: Tensor, c: Tensor, name: str) -> list[tuple[int, int]]:
    """(eigenvalue index, coordinate) pairs: share_qk keeps the largest positive eigenvalues on the positive
    gains and the most negative on the negative ones (at most as many as there are such gains); symmetric keeps
    the eigenvalues largest in modulus, one per non-zero gain. Largest |λ| on largest |c| (the pairing does not
    change the folded form)."""
    if name == "symmetric":
        cols = [int(j) for j in c.abs().argsort(descending=True) if c[j] != 0]
        eig = [int(j) for j in lam.abs().argsort(descending=True)][:len(cols)]
        return list(zip(eig, cols, strict=False))
    pairs = []
    for sign in (1.0, -1.0):
        cols = [int(j) for j in (sign * c).argsort(descending=True) if sign * c[j] > 0]
        eig = [int(j) for j in (sign * lam).argsort(descending=True) if sign * lam[j] > 0]
        pairs += list(zip(eig, cols, strict=False))
    return pairs


def folded_factors(base: AttentionLayer, idx: list[int]) -> tuple[Tensor, Tensor, Tensor, bool]:
    """Ŵ_Q, Ŵ_K (n, R, d) of query heads `idx` (R = D, or D + 1 with the biases as the last row), c = g_q g_k
    (n, d), and whether the biases are in: M_f = Ŵ_Q diag(c) Ŵ_Kᵀ."""
    h = torch.tensor(idx, dtype=torch.int64)
    kv = base.kv_index()[h]
    Wq, Wk = base.W_Q[h].to(F64), base.W_K[kv].to(F64)
    biased = base.b_Q is not None and base.b_K is not None
    if biased:
        Wq = torch.cat([Wq, base.b_Q[h].to(F64).unsqueeze(-2)], -2)  # (n, D, d) + (n, 1, d) -> (n, D+1, d)
        Wk = torch.cat([Wk, base.b_K[kv].to(F64).unsqueeze(-2)], -2)
    gq, gk = gains(base, idx)
    return Wq, Wk, gq * gk, biased


def one_matrix_edit(base: AttentionLayer, idx: list[int], name: str) -> tuple[dict[str, Tensor], Tensor, Tensor]:
    """share_qk / symmetric / share_qkv's query-key part on a q/k-normed layer whose edited heads have keys of
    their own: the new W_Q, W_K, b_Q, b_K (full tensors, rows `idx` replaced), the predicted figure (relative
    change of the folded form) and W (n, D, d) for share_qkv's values."""
    Aq, Ak, c, biased = folded_factors(base, idx)
    W, s, off2, tot2 = one_matrix(Aq, Ak, c, name)
    D = base.W_Q.shape[1]
    kw = {"W_Q": _rows(base.W_Q, idx, W[..., :D, :]), "W_K": _rows(base.W_K, idx, W[..., :D, :] * s.unsqueeze(-2))}
    if biased:
        kw["b_Q"] = _rows(base.b_Q, idx, W[..., D, :])
        kw["b_K"] = _rows(base.b_K, idx, W[..., D, :] * s)
    fig = torch.where(tot2 > 0, (off2 / tot2.clamp_min(torch.finfo(F64).tiny)).sqrt(),
                      torch.full_like(tot2, float("nan")))
    return kw, fig, W[..., :D, :]


def _rows(full: Tensor, idx: list[int], new: Tensor) -> Tensor:
    out = full.clone()
    out[idx] = new.to(full.dtype)
    return out


def fold_queries_keys(layer: AttentionLayer) -> tuple[Tensor, Tensor]:
    """W_Q diag(g_q), W_K diag(g_k) of every head (float64): the folded factors the rank edit reads."""
    H, G = layer.spec.n_heads, layer.spec.n_kv_heads
    gq = per_head(layer.q_norm, torch.arange(H))
    gk = per_head(layer.k_norm, torch.arange(G))
    return layer.W_Q.to(F64) * gq.unsqueeze(-2), layer.W_K.to(F64) * gk.unsqueeze(-2)


def unfold_queries(layer: AttentionLayer, folded: Tensor, idx: list[int]) -> Tensor:
    """The raw W_Q with rows `idx` from the folded query factor `folded` (H, D, d): divided by g_q, and the
    original column where g_q = 0 (it never reaches a score)."""
    h = torch.tensor(idx, dtype=torch.int64)
    gq = per_head(layer.q_norm, h).unsqueeze(-2)  # (n, 1, d)
    raw = torch.where(gq != 0, folded[h].to(F64) / torch.where(gq != 0, gq, 1.0), layer.W_Q[h].to(F64))
    return _rows(layer.W_Q, idx, raw)


def predictor(plain: str, edit: Edit, layers) -> str:
    """What EditResult.predicted holds for `edit` on `layers`: `plain` (edits.PREDICTORS), or, where a layer has
    q/k norms, the folded form's relative change that the q/k-norm edits report instead."""
    if edit.name not in DEFINED or not any(normed(L) for L in layers):
        return plain
    folded = "relative change of the folded form W_Q diag(g_q g_k) W_Kᵀ (q/k norms)"
    return f"rms of the {folded} and of W_V W_O" if edit.name == "share_qkv" else folded
