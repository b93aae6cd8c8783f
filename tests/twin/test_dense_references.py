"""Constrained twins against dense references: the same model with the constraint written as plain weight tying
(one Parameter object for the tied projections, a frozen identity), trained by a plain loop from the twin's own
initial tensors on the same batches; and the identities every twin keeps at its start (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from qkinspect.experiment.heal import adamw
from qkinspect.twin.model import build, config_for, plain_copy, standard_model, state_tensors
from qkinspect.twin.request import Shape
from qkinspect.twin.train import train_step

torch.set_num_threads(1)
SHAPE = Shape("llama", 2, 32, 4, 16)


def _tied(variant: str, tensors: dict) -> nn.Module:
    """The llama model of `tensors` with the constraint as weight tying: share_qk ties q_proj to k_proj,
    share_qkv ties v_proj too, share_kv ties k_proj to v_proj, wq_identity freezes q_proj at its (identity)
    value."""
    model = plain_copy(config_for(SHAPE, 40), tensors)
    for block in model.model.layers:
        a = block.self_attn
        if variant in ("share_qk", "share_qkv"):
            a.q_proj.weight = a.k_proj.weight
        if variant == "share_qkv":
            a.v_proj.weight = a.k_proj.weight
        if variant == "share_kv":
            a.k_proj.weight = a.v_proj.weight
        if variant == "wq_identity":
            a.q_proj.weight.requires_grad_(False)
    return model


def _loss(model, x):
    logits = model(input_ids=x[:, :-1]).logits
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))


@pytest.mark.parametrize("init", ["draw", "nearest"])
@pytest.mark.parametrize("variant", ["share_qk", "share_qkv", "share_kv", "wq_identity"])
def test_constrained_twin_is_the_tied_model(variant, init):
    built = build(variant, SHAPE, 40, seed=1, init=init)
    ref = _tied(variant, state_tensors(built.model))
    params = [p for p in ref.parameters() if p.requires_grad]
    assert sum(p.numel() for p in params) == built.params  # the free parameters are the tied model's
    opt, ref_opt = adamw(built.trained, 3e-3), adamw(params, 3e-3)
    g = np.random.default_rng(0)
    for _ in range(5):
        x = torch.from_numpy(g.integers(0, 40, size=(4, 17)))
        got = train_step(built, opt, x)
        loss = _loss(ref, x)
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert got == pytest.approx(float(loss.detach()), rel=1e-5)


@settings(max_examples=6, deadline=None)
@given(st.sampled_from(["llama", "gpt2"]), st.integers(1, 2), st.sampled_from([1, 2, 4]), st.sampled_from([2, 4, 6]),
       st.integers(0, 1000))
def test_a_twin_starts_inside_its_constraint_from_the_standard_tensors(arch, layers, heads, d_head, seed):
    shape = Shape(arch, layers, heads * d_head, heads, 8)
    std = state_tensors(standard_model(config_for(shape, 20), seed))
    n_std = build("standard", shape, 20, seed).params
    built = build("share_qk", shape, 20, seed)
    twin = state_tensors(built.model)
    for k, v in std.items():  # everything outside the attention's input projections is the standard twin's
        if not any(p in k for p in ("q_proj", "k_proj", "c_attn")):
            assert torch.equal(v, twin[k]), k
    D = heads * d_head
    assert n_std - built.params == layers * D * D + (layers * D if arch == "gpt2" else 0)  # no W_Q (nor b_Q)
    assert built.violation() == 0.0


def test_share_qkv_leaves_the_value_bias_its_own_because_it_is_an_output_bias():
    """Under gpt2, share_qkv reads W_Q, W_K and W_V from one matrix and b_Q from b_K, but keeps b_V its own
    (docs/twin.md): attention weights sum to 1 over the keys, so b_V adds b_V W_O at every position whatever the
    scores, which b_O holds as well. Moving b_V into b_O leaves every output as it was: tying b_V to b_K would
    constrain nothing of the form, only tie b_K's gradient to an output bias's."""
    shape = Shape("gpt2", 2, 32, 4, 16)
    tensors = state_tensors(build("share_qkv", shape, 40, seed=0).model)
    g = torch.Generator().manual_seed(0)
    for i in range(2):  # a value bias that is not zero, as training makes it
        tensors[f"transformer.h.{i}.attn.c_attn.bias"][64:] = torch.randn(32, generator=g)
    model = plain_copy(config_for(shape, 40), tensors)
    folded = {k: v.clone() for k, v in tensors.items()}
    for i in range(2):
        b_V = folded[f"transformer.h.{i}.attn.c_attn.bias"][64:].clone()
        folded[f"transformer.h.{i}.attn.c_attn.bias"][64:] = 0.0
        folded[f"transformer.h.{i}.attn.c_proj.bias"] += b_V @ folded[f"transformer.h.{i}.attn.c_proj.weight"]
    other = plain_copy(config_for(shape, 40), folded)
    x = torch.randint(0, 40, (3, 16), generator=g)
    with torch.no_grad():
        a, b = model(input_ids=x).logits, other(input_ids=x).logits
    assert float((a - b).abs().max()) < 1e-5 and float(a.abs().max()) > 0.1
