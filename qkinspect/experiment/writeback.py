"""Write-back for the families beyond the first three (docs/experiments.md, "The model"): q/k norms (Qwen3,
Gemma 3, OLMo2), Phi-3's fused sectioned `qkv_proj` and GPT-NeoX's fused `query_key_value` interleaved per head.
Each writer is the inverse of its adapter's named reshape; `hf.write_layer` dispatches here.

q/k norms sit between the projection and the score. The edits change the projections only (the form edits are
defined through the norms: `edit_qknorm`); the norm modules stay the model's own, with one exception: OLMo2
normalises the whole key projection, so when an edit gives query heads their own keys the key norm's gain is
repeated with them (head h gets its key/value head's gains). That copy changes nothing unedited: the
RMS over the repeated projection equals the RMS over the original one.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import Tensor, nn

from qkinspect.experiment.hf import _linear, _out_rows, _rows, _swap
from qkinspect.layer import AttentionLayer


def _per_head_rows(W: Tensor) -> Tensor:
    """(n, D, d) -> (n, d, D): each head's output rows of an nn.Linear [out, in]."""
    return W.transpose(1, 2)


def _bias(b: Tensor | None, n: int, d: int, like: Tensor) -> Tensor:
    return torch.zeros(n, d, dtype=like.dtype) if b is None else b


def _out(L: AttentionLayer, like: nn.Module) -> nn.Linear:
    return _linear(_out_rows(L.W_O), L.b_O, like)  # (H, d, D) -> (D, H*d)


def qk_norm_swaps(attn: nn.Module, L: AttentionLayer) -> dict[str, nn.Module]:
    """OLMo2 (a key norm over the whole projection): the norm for the layer's key/value heads when an edit gave
    query heads their own keys, its gain repeated per query head from the module's own; nothing otherwise."""
    norm = getattr(attn, "k_norm", None)
    weight = getattr(norm, "weight", None)
    s = L.spec
    if weight is None or L.extra.get("qk_norm_scope") != "projection":
        return {}  # per-head norms (Qwen3, Gemma 3) read d values, whatever the number of heads
    groups = weight.numel() // s.d_head
    if groups == s.n_kv_heads:
        return {}
    rep = s.n_heads // groups
    kv = torch.arange(s.n_heads, device=weight.device) // rep  # query head h reads key/value head h // rep
    expanded = copy.deepcopy(norm)
    gains = weight.detach().view(groups, s.d_head)[kv].reshape(-1)  # (G*d,) -> (G, d) -> (H, d) -> (H*d,)
    expanded.weight = nn.Parameter(gains.clone())
    return {"k_norm": expanded}


def write_phi3(block: nn.Module, L: AttentionLayer) -> Callable[[], None]:
    """Phi-3: qkv_proj rows sectioned [q (H*d) | k (G*d) | v (G*d)], o_proj; the module reads its key/value
    head count from `num_key_value_heads` when it splits the rows."""
    a = block.self_attn
    s = L.spec
    H, G, d = s.n_heads, s.n_kv_heads, s.d_head
    weight = torch.cat([_rows(L.W_Q), _rows(L.W_K), _rows(L.W_V)])  # (H*d + 2*G*d, D): [q | k | v]
    biases = (L.b_Q, L.b_K, L.b_V)
    bias = None if all(b is None for b in biases) else torch.cat(
        [_bias(b, n, d, L.W_Q).reshape(-1) for b, n in zip(biases, (H, G, G), strict=True)])
    return _swap(a, {"qkv_proj": _linear(weight, bias, a.qkv_proj), "o_proj": _out(L, a.o_proj),
                     "num_key_value_heads": G, "num_key_value_groups": H // G})


def write_gpt_neox(block: nn.Module, L: AttentionLayer) -> Callable[[], None]:
    """GPT-NeoX: query_key_value rows interleaved per head (head, [q, k, v], d), dense."""
    a = block.attention
    s = L.spec
    H, d = s.n_heads, s.d_head
    if s.n_kv_heads != H:
        raise ValueError(f"layer {L.layer}: GPT-NeoX has one key/value head per query head, not {s.n_kv_heads}")
    weight = torch.stack([_per_head_rows(W) for W in (L.W_Q, L.W_K, L.W_V)], 1)  # 3 x (H, d, D) -> (H, 3, d, D)
    biases = (L.b_Q, L.b_K, L.b_V)
    bias = None if all(b is None for b in biases) else torch.stack(
        [_bias(b, H, d, L.W_Q) for b in biases], 1).reshape(-1)  # (H, 3, d) -> (H*3*d,)
    return _swap(a, {"query_key_value": _linear(weight.reshape(H * 3 * d, -1), bias, a.query_key_value),
                     "dense": _out(L, a.dense)})


WRITERS = {"phi3": write_phi3, "gpt_neox": write_gpt_neox}
