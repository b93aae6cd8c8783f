"""Where the rest of the network sees a head's change: the residual stream its block writes into
(docs/experiments.md, "Unreliable heads").

A block's attention output o (the output projection's output, every head and the bias) reaches the residual stream
through one of three maps of the block's input x:

- pre-norm (Llama, Mistral, Qwen, Gemma 1, Phi-3, GPT-2, GPT-NeoX): r = x + o;
- sandwich (Gemma 2 and 3, OLMo 2): r = x + N(o), N the block's `post_attention_layernorm`, an RMSNorm of o;
- post-norm (BERT, RoBERTa): r = N(x + o), N the LayerNorm of the attention's output module.

`reach` is how far one head's change Δo_h moves r, relative to r, token by token: the root mean square over tokens
of |R(x, o + Δo_h) − R(x, o)| / |R(x, o)|. It is what the layers above (and their norms) are given, so it measures
how far the edit pushes the model in the model's own units, where |Δo_h| / |o_h| (`moved`) does not: a post-norm
rescales the head's change by 1 / rms(o) whatever |o_h| is, and a residual stream much larger than o absorbs a
large change of a small head.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

SANDWICH = ("gemma2", "gemma3_text", "olmo2")  # model_type: r = x + post_attention_layernorm(o)
POST_NORM = ("bert", "roberta")  # r = LayerNorm(x + o), the LayerNorm of the attention's output module

Writer = Callable[[Tensor, Tensor], Tensor]  # R(x, o) -> r, broadcasting over leading dimensions


def writer(model_type: str, block: nn.Module) -> Writer:
    """The map R(x, o) by which `block` (a transformer layer of a `model_type` model) writes its attention output
    o into the residual stream, given the block's input x."""
    if model_type in SANDWICH:
        norm = block.post_attention_layernorm
        return lambda x, o: x + norm(o)
    if model_type in POST_NORM:
        norm = block.attention.output.LayerNorm
        return lambda x, o: norm(x + o)
    return lambda x, o: x + o


def residual_change(write: Writer, x: Tensor, o: Tensor, delta: Tensor) -> Tensor:
    """|R(x, o + Δo_h) − R(x, o)|² / |R(x, o)|² per token and head (M, H), float64, from the block's input x and
    attention output o (M, D) and every head's change Δo (M, H, D), each head changed alone. A token whose residual
    is 0 gives 0 where the head does not change it, else inf."""
    with torch.no_grad():
        r = write(x, o)  # (M, D)
        r1 = write(x[:, None, :], o[:, None, :] + delta.to(o.dtype))  # (M, H, D)
        change2 = (r1 - r[:, None, :]).double().pow(2).sum(-1)
        resid2 = r.double().pow(2).sum(-1)[:, None].expand_as(change2)
        ratio = change2 / resid2
        return torch.where(change2 == 0, torch.zeros_like(ratio), ratio)


def reach(summed: Tensor, tokens: int) -> Tensor:
    """The root mean square over `tokens` tokens of |Δr_h| / |r| (H,), from residual_change summed over them."""
    return (summed / tokens).sqrt()
