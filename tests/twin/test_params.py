"""The free parameters each twin reports, counted by hand for every variant on both architectures, checked against
the parameter elements a loss actually reaches (a nonzero gradient), and `+params` arms that move the MLP the way
the count says (issue 44: rank:K counted its full W_Q beside its factors)."""

from __future__ import annotations

import math

import pytest
import torch

from qkinspect.twin.model import build, mlp_width
from qkinspect.twin.request import Shape
from qkinspect.twin.train import next_token_loss

torch.set_num_threads(1)
L, D, H, T, V = 2, 32, 4, 16, 24
d = D // H


def hand_count(arch: str, variant: str) -> int:
    """Free parameters by hand. llama: untied embeddings and head, q/k/v/o without bias, SwiGLU of M =
    16·ceil(8D/3/16), two RMSNorms a layer and one at the end. gpt2: tied embeddings, positions, fused c_attn with
    bias, c_proj with bias, MLP 4D with biases, two LayerNorms (weight, bias) a layer and one at the end."""
    if arch == "llama":
        M = 16 * math.ceil(8 * D / 3 / 16)
        std = 2 * V * D + D + L * (4 * D * D + 3 * D * M + 2 * D)
        b = 0  # no query/key/value bias
    else:
        std = V * D + T * D + 2 * D + L * (3 * D * D + 3 * D + D * D + D + 8 * D * D + 5 * D + 4 * D)
        b = D  # one bias vector per projection
    wq = D * D + b  # a layer's W_Q and b_Q
    if variant == "standard":
        return std
    if variant in ("share_qk", "share_qk_reformer", "symmetric", "wq_identity"):
        return std - L * wq  # W_Q (and b_Q) read from W_K, its signs, or pinned at I (and 0)
    if variant == "share_qkv":
        return std - L * (wq + D * D)  # W_V is W_K too; b_V stays its own
    if variant == "share_kv":
        return std - L * wq  # W_K (and b_K) read from W_V (and b_V)
    if variant == "bilinear":
        return std - L * (2 * wq) + L * H * D * D  # no W_Q, W_K (nor their biases); one D×D W_QK per head
    K = int(variant.partition(":")[2])
    if arch == "llama":  # every dimension is a rotary pair: K // 2 pairs kept per head, the others' W_Q and W_K
        return std - 2 * L * H * D * (d - 2 * min(K // 2, d // 2))  # columns never move (a dropped pair scores 0)
    k = min(K, d)  # gpt2: each head's W_Q is the factor pair A (D×k) C (k×d), b_Q free
    return std - L * D * D + L * H * k * (D + d)


VARIANTS = ["standard", "share_qk", "share_qk_reformer", "symmetric", "share_qkv", "share_kv", "rank:1", "rank:2",
            "rank:3", "rank:8", "wq_identity", "bilinear"]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_free_parameters_are_the_hand_count_and_what_the_loss_reaches(arch, variant):
    built = build(variant, Shape(arch, L, D, H, T), V, seed=3)
    assert built.params == hand_count(arch, variant)
    # every token and every position in the batch: each free element has a gradient, each held one none
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.arange(V), torch.randint(0, V, (4 * (T + 1) - V,), generator=g)]).reshape(4, T + 1)
    from qkinspect.experiment.edits.parametrised import cached

    with cached(built.forms):
        next_token_loss(built.model, x).backward()
    reached = sum(int((p.grad != 0).sum()) for p in built.trained if p.grad is not None)
    assert reached == built.params


@pytest.mark.parametrize("arch, variant, wider", [("gpt2", "rank:2", True), ("llama", "rank:2", True),
                                                  ("gpt2", "share_qk", True), ("llama", "bilinear", False),
                                                  ("gpt2", "bilinear", False)])
def test_matched_arms_move_the_mlp_the_way_the_count_says(arch, variant, wider):
    shape = Shape(arch, L, D, H, T)
    std = build("standard", shape, V, seed=0)
    arm = build(variant + "+params", shape, V, seed=0)
    assert (mlp_width(arm.model.config) > mlp_width(std.model.config)) is wider
    assert abs(arm.params - std.params) <= 0.01 * std.params
