"""Processing as pure transforms of an AttentionLayer (inputs never mutated; ARCHITECTURE.md §2).

fold_ln: the norm before attention computes x = gain * normalise(y) + bias, so q = x W_Q + b_Q
= normalise(y) diag(gain) W_Q + (b_Q + bias W_Q): W -> diag(gain) W, b -> b + bias W (for Q with the query-side
norm, for K and V with the key/value-side norm). LayerNorm's centring is not folded.

fold_qk_norm: q/k norms (Qwen3, OLMo2, Gemma3) scale each head's normalised q and k by gains g_q, g_k, so the
scores are q̂ diag(g_q g_k) k̂ᵀ: W_Q -> W_Q diag(g_q), W_K -> W_K diag(g_k) (biases likewise) puts the gains into
the bilinear form.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from qkinspect.errors import InputError
from qkinspect.layer import AttentionLayer, Norm


def _up(t: Tensor) -> Tensor:
    """Half precision up to float32 before scaling (a bf16 product would round the folded weights)."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def _fold_norm(W: Tensor, b: Tensor | None, norm: Norm) -> tuple[Tensor, Tensor | None]:
    """W (n, D, d), b (n, d) -> diag(gain) W, b + bias W."""
    W = _up(W)
    gain = norm.gain.to(W.dtype)
    if gain.shape != (W.shape[1],):
        raise InputError(f"norm gain has shape {tuple(gain.shape)}, but the projection reads width {W.shape[1]}")
    folded = gain.view(1, -1, 1) * W  # (1, D, 1) * (n, D, d)
    if norm.bias is None:
        return folded, b
    shift = torch.einsum("m,nmd->nd", norm.bias.to(W.dtype), W)  # bias @ W per head: (n, d)
    return folded, shift if b is None else _up(b).to(W.dtype) + shift


def fold_ln(layer: AttentionLayer) -> AttentionLayer:
    """Fold the preceding LayerNorm/RMSNorm (gain, and LayerNorm bias) into W_Q, W_K, W_V and their biases.

    Raises:
        InputError: the adapter gave no norm for this layer.

    Example:
        >>> folded = fold_ln(layer)  # doctest: +SKIP
        >>> folded.norm_q is None  # the norm now lives in the weights  # doctest: +SKIP
        True
    """
    where = f"cannot fold the input norm into the projections: {layer.block} layer {layer.layer}"
    if layer.norm_q is None:
        raise InputError(f"{where} has no norm before the query projection")
    if layer.norm_kv is None:
        raise InputError(f"{where} has no norm before the key/value projections")
    W_Q, b_Q = _fold_norm(layer.W_Q, layer.b_Q, layer.norm_q)
    W_K, b_K = _fold_norm(layer.W_K, layer.b_K, layer.norm_kv)
    W_V, b_V = _fold_norm(layer.W_V, layer.b_V, layer.norm_kv)
    if layer.W_K is layer.W_Q and layer.norm_kv is layer.norm_q:
        W_K = W_Q  # keep shared-QK heads shared
    return replace(layer, W_Q=W_Q, W_K=W_K, W_V=W_V, b_Q=b_Q, b_K=b_K, b_V=b_V, norm_q=None, norm_kv=None)


def _per_head_gain(g: Tensor, n: int, d: int) -> Tensor:
    """(d,) or (n, d) -> (n, 1, d)."""
    if g.shape == (d,):
        return g.view(1, 1, d).expand(n, 1, d)  # one gain shared by every head
    if g.shape == (n, d):
        return g.view(n, 1, d)  # (n, d) -> (n, 1, d)
    raise InputError(f"q/k norm gain has shape {tuple(g.shape)}; expected ({d},) or ({n}, {d})")


def fold_qk_norm(layer: AttentionLayer) -> AttentionLayer:
    """Fold q/k-norm gains into the form: W_Q -> W_Q diag(g_q), W_K -> W_K diag(g_k), biases likewise.

    Raises:
        InputError: the layer has no q/k norm gains.

    Example:
        >>> folded = fold_qk_norm(layer)  # a Qwen3 / OLMo2 / Gemma3 layer  # doctest: +SKIP
        >>> folded.q_norm is None  # doctest: +SKIP
        True
    """
    if layer.q_norm is None or layer.k_norm is None:
        raise InputError(f"cannot fold q/k-norm gains: {layer.block} layer {layer.layer} has none")
    W_Q, W_K = _up(layer.W_Q), _up(layer.W_K)
    H, G, d = W_Q.shape[0], W_K.shape[0], W_Q.shape[2]
    gq = _per_head_gain(layer.q_norm.to(W_Q.dtype), H, d)
    gk = _per_head_gain(layer.k_norm.to(W_K.dtype), G, d)
    b_Q = None if layer.b_Q is None else _up(layer.b_Q).to(W_Q.dtype) * gq[:, 0]
    b_K = None if layer.b_K is None else _up(layer.b_K).to(W_K.dtype) * gk[:, 0]
    return replace(layer, W_Q=W_Q * gq, W_K=W_K * gk, b_Q=b_Q, b_K=b_K, q_norm=None, k_norm=None)
