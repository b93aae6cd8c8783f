"""Decoders close to Llama (StarCoder2, StableLM, Granite, Cohere): the canonical matrices reproduce the model's own
q/k/v states, output projection, pre-attention norm (hence --fold-ln) and q/k-norm outputs, captured in a real
forward pass; attention probabilities rebuilt with the model's own rotary function pin the scale (Granite's
attention_multiplier), the rotary style (Cohere's interleaved pairs, StableLM's partial rotation) and the window."""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
import transformers as tf

from qkinspect.layer import Norm
from qkinspect.metrics.fold import fold_ln
from tests.adapters.harness import apply_norm, assert_close, capture, load_layers, per_head
from tests.adapters.test_decoders import (
    Case,
    V,
    build,
    eps_of,
    get_attr,
    llama_like,
    reproduced_layers,
)

G = 2
CASES = {
    "starcoder2": Case(llama_like(tf.Starcoder2Config), expect=dict(n_kv_heads=G, rotary_dims=16)),
    "starcoder2-sliding": Case(llama_like(tf.Starcoder2Config, sliding_window=3),
                               expect=dict(attention_kind="sliding")),
    "stablelm": Case(llama_like(tf.StableLmConfig, use_qkv_bias=True), expect=dict(rotary_dims=4, qk_norm=False)),
    "stablelm-qk-parallel": Case(llama_like(tf.StableLmConfig, qk_layernorm=True, use_parallel_residual=True,
                                            partial_rotary_factor=0.5),
                                 qk=("q_layernorm", "k_layernorm"), expect=dict(rotary_dims=8, qk_norm=True)),
    "granite": Case(llama_like(tf.GraniteConfig, attention_multiplier=0.3, attention_bias=True,
                               embedding_multiplier=3.0, residual_multiplier=0.5), expect=dict(scale=0.3)),
    "cohere": Case(llama_like(tf.CohereConfig), expect=dict(rotary_dims=16, qk_norm=False)),
    "cohere-qk-norm": Case(llama_like(tf.CohereConfig, use_qk_norm=True, attention_bias=True), qk=("q_norm", "k_norm"),
                           expect=dict(qk_norm=True)),
}
CONFIGS = {n: c.config for n, c in CASES.items()}  # test_config reads these


def run_model(model, **kw):
    ids = torch.randint(0, V, (2, 7), generator=torch.Generator().manual_seed(1))
    return model(ids, **kw)


def fresh(name: str) -> Case:
    """A copy of the case, so that a model (set_attn_implementation ...) never changes the shared config."""
    return copy.deepcopy(CASES[name])


@pytest.mark.parametrize("name", sorted(CASES))
def test_split_projections_reproduce_model(name, tmp_path):
    for i, ours, mods, rec in reproduced_layers(fresh(name), tmp_path, run_model):
        (y,), _, x = rec[-1][0]  # the norm's input (residual stream) and output (what q/k/v read)
        folded = fold_ln(ours)  # --fold-ln: the folded matrices on the un-scaled, un-shifted normalised stream
        unit = Norm(ours.norm_q.kind, torch.ones_like(ours.norm_q.weight))  # no gain, no bias
        normalised = apply_norm(unit, y, eps_of(mods[-1]))
        for W, b in (("W_Q", "b_Q"), ("W_K", "b_K"), ("W_V", "b_V")):
            fb, ob = getattr(folded, b), getattr(ours, b)
            assert_close(per_head(normalised, getattr(folded, W).double(), None if fb is None else fb.double()),
                         per_head(x.double(), getattr(ours, W).double(), None if ob is None else ob.double()),
                         f"{name} layer {i} fold {W}")


def test_flags(tmp_path):
    expected = {"starcoder2": ("layernorm", True, "half"), "stablelm": ("layernorm", True, "half"),
                "granite": ("rmsnorm", False, "half"), "cohere": ("layernorm", False, "interleaved")}
    for name, (kind, has_bias, style) in expected.items():
        _, path = build(fresh(name), tmp_path / name)
        lay = load_layers(path)[0]
        assert lay.norm_q.kind == kind and (lay.norm_q.bias is not None) == has_bias, name
        assert lay.extra["rotary_style"] == style, name


# -- probabilities --------------------------------------------------------------------------------------------------


def rotate(name: str, q, k, cos, sin, rot: int):
    """The model's own apply_rotary_pos_emb on the first `rot` dims of each head (StableLM rotates only those)."""
    family = name.split("-")[0]
    mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    q_rot, k_rot = mod.apply_rotary_pos_emb(q[..., :rot], k[..., :rot], cos, sin)
    return torch.cat([q_rot, q[..., rot:]], -1), torch.cat([k_rot, k[..., rot:]], -1)


def probabilities(name: str, ours, x, kwargs) -> torch.Tensor:
    """softmax(scale * rot(q_h) . rot(k_{h // rep})), causal (and windowed), from the canonical matrices alone."""
    s = ours.spec
    q = per_head(x.double(), ours.W_Q.double(), None if ours.b_Q is None else ours.b_Q.double())  # (B, T, H, d)
    k = per_head(x.double(), ours.W_K.double(), None if ours.b_K is None else ours.b_K.double())  # (B, T, G, d)
    q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, T, n, d) -> (B, n, T, d)
    cos, sin = (t.double() for t in kwargs["position_embeddings"])
    q, k = rotate(name, q, k, cos, sin, s.rotary_dims)
    k = k[:, ours.kv_index()]  # (B, G, T, d) -> (B, H, T, d): query head h reads KV head h // rep
    scores = (q @ k.transpose(-1, -2)) * s.score_scale  # (B, H, T, T)
    T = scores.shape[-1]
    allowed = torch.ones(T, T, dtype=torch.bool).tril()
    window = ours.extra.get("sliding_window")
    if window:
        allowed &= ~allowed.tril(-window)
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1)


@pytest.mark.parametrize("name", ["starcoder2-sliding", "stablelm", "granite", "cohere"])
def test_attention_probabilities(name, tmp_path):
    case = fresh(name)
    model, path = build(case, tmp_path)
    layers = load_layers(path)
    attns = [get_attr(b, case.attn) for b in get_attr(model, case.layers)]
    with capture(*attns) as rec, torch.no_grad():
        out = run_model(model, output_attentions=True)
    for ours, r in zip(layers, rec, strict=True):
        args, kwargs, _ = r[0]
        x = args[0] if args else kwargs["hidden_states"]
        want = out.attentions[ours.layer]
        assert want[..., -1, :].amax(-1).mean() > 2 / want.shape[-1], "probabilities too flat to tell matrices apart"
        assert_close(probabilities(name, ours, x, kwargs), want, f"{name} layer {ours.layer} probabilities")
