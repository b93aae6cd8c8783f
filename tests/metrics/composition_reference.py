"""The dense float64 reference for composition scores, read straight from transformers modules (not through
qkinspect's adapters): each family's projections cut into heads by hand, each head's W_OV = W_V W_O and
W_QK = W_Q W_Kᵀ formed as d_model x d_model matrices, and each score taken by its definition."""

from __future__ import annotations

import numpy as np
import torch

Head = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # W_Q (D, d), W_K (Dk, d), W_V (Dk, dv), W_O (dv, D)


def t(w: torch.Tensor) -> np.ndarray:
    return w.detach().to(torch.float64).numpy()


def split_linear(weight: torch.Tensor, n: int) -> list[np.ndarray]:
    """nn.Linear weight (n d, D) -> n row-vector factors (D, d)."""
    w = t(weight).T  # (D, n d)
    d = w.shape[1] // n
    return [w[:, i * d:(i + 1) * d] for i in range(n)]


def split_out(weight: torch.Tensor, n: int) -> list[np.ndarray]:
    """nn.Linear output weight (D, n dv) -> n factors (dv, D)."""
    w = t(weight).T  # (n dv, D)
    dv = w.shape[0] // n
    return [w[i * dv:(i + 1) * dv] for i in range(n)]


def heads_from(Q: list, K: list, V: list, O: list, gain_q=None, gain_kv=None) -> list[Head]:
    """Per query head h its (W_Q, W_K, W_V, W_O), key/value head h // (H / G); gains folded as diag(g) W."""
    H, G = len(Q), len(K)
    gq = np.ones(Q[0].shape[0]) if gain_q is None else t(gain_q)
    gk = np.ones(K[0].shape[0]) if gain_kv is None else t(gain_kv)
    return [(gq[:, None] * Q[h], gk[:, None] * K[h // (H // G)], gk[:, None] * V[h // (H // G)], O[h])
            for h in range(H)]


def llama_like(layer, H: int, G: int, fold: bool) -> list[Head]:
    a = layer.self_attn
    g = layer.input_layernorm.weight if fold else None
    return heads_from(split_linear(a.q_proj.weight, H), split_linear(a.k_proj.weight, G),
                      split_linear(a.v_proj.weight, G), split_out(a.o_proj.weight, H), g, g)


def gpt2(block, H: int, fold: bool) -> list[Head]:
    w = t(block.attn.c_attn.weight)  # Conv1D: (D, 3D), [in, out], sectioned q | k | v
    D = w.shape[0]
    cut = lambda m: [m[:, i * (D // H):(i + 1) * (D // H)] for i in range(H)]  # noqa: E731
    o = t(block.attn.c_proj.weight)  # (D, D) [in, out]
    O = [o[i * (D // H):(i + 1) * (D // H)] for i in range(H)]
    g = block.ln_1.weight if fold else None
    return heads_from(cut(w[:, :D]), cut(w[:, D:2 * D]), cut(w[:, 2 * D:]), O, g, g)


def bert(layer, H: int) -> list[Head]:
    s = layer.attention.self
    return heads_from(split_linear(s.query.weight, H), split_linear(s.key.weight, H), split_linear(s.value.weight, H),
                      split_out(layer.attention.output.dense.weight, H))


def gpt_neox(layer, H: int, fold: bool) -> list[Head]:
    a = layer.attention
    w = t(a.query_key_value.weight)  # (3 D, D) [out, in], rows per head [(head, 3, d)]
    D = w.shape[1]
    d = D // H
    w = w.reshape(H, 3, d, D)
    g = layer.input_layernorm.weight if fold else None
    return heads_from([w[h, 0].T for h in range(H)], [w[h, 1].T for h in range(H)], [w[h, 2].T for h in range(H)],
                      split_out(a.dense.weight, H), g, g)


def phi3(layer, H: int, G: int, fold: bool) -> list[Head]:
    a = layer.self_attn
    w = t(a.qkv_proj.weight)  # (H d + 2 G d, D): sectioned rows q | k | v
    d = a.head_dim
    q, k, v = w[:H * d], w[H * d:(H + G) * d], w[(H + G) * d:]
    cut = lambda m, n: [m[i * d:(i + 1) * d].T for i in range(n)]  # noqa: E731
    g = layer.input_layernorm.weight if fold else None
    return heads_from(cut(q, H), cut(k, G), cut(v, G), split_out(a.o_proj.weight, H), g, g)


def attention(a, H: int, names=("q_proj", "k_proj", "v_proj", "out_proj")) -> list[Head]:
    """BART/T5-style separate projections (raw)."""
    q, k, v, o = (getattr(a, n).weight for n in names)
    return heads_from(split_linear(q, H), split_linear(k, H), split_linear(v, H), split_out(o, H))


def score(X: np.ndarray, Y: np.ndarray) -> float:
    return float(np.linalg.norm(X @ Y) / (np.linalg.norm(X) * np.linalg.norm(Y)))


def pair_scores(a: list[Head], b: list[Head], kinds=("q", "k", "v")) -> dict[str, np.ndarray]:
    """kind -> (H_a, H_b) scores of every head of layer a into every head of layer b, from dense matrices."""
    ov_a = [V @ O for _, _, V, O in a]
    qk_b = [Q @ K.T for Q, K, _, _ in b]
    ov_b = [V @ O for _, _, V, O in b]
    right = {"q": qk_b, "k": [m.T for m in qk_b], "v": ov_b}
    return {k: np.array([[score(x, y) for y in right[k]] for x in ov_a]) for k in kinds}
