"""Attention probabilities: from qkinspect's matrices, the spec's scale and the layer input captured in a real
forward pass, rebuild the model's own attention weights (eager attention, output_attentions=True). Positions
enter only through the model's own terms: its rotary function applied to its captured cos/sin, or the ALiBi
tensor it passed to the layer; GPT-J's rotation, whose table transformers keeps private, is written out from its
definition (only public transformers APIs are used: private ones change between releases).
One model per fused layout (GPT-2 sectioned Conv1D, GPT-NeoX and BLOOM interleaved
per head, Falcon interleaved per KV group, multi-query and multi-head, MPT and Phi-3 sectioned), plus Llama
(grouped query), GPT-Neo (scale 1, local window), Mistral and Phi-3 (sliding windows), Gemma2
(query_pre_attn_scalar, soft-capping), GPT-J (interleaved partial rotary) and GPT-2 with
scale_attn_by_inverse_layer_idx (a scale per layer)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import pytest
import torch
import transformers as tf

from tests.adapters import test_dec_fused as fused
from tests.adapters import test_decoders as split
from tests.adapters.harness import assert_close, capture, load_layers, per_head, randomize, save_tiny

T, V = 7, 99


@dataclass
class Case:
    config: tf.PretrainedConfig
    layers: str  # base model attribute path to the decoder layers
    attn: str  # decoder layer attribute path to the attention module
    rotary: str | None = None  # modeling module whose apply_rotary_pos_emb(q, k, cos, sin) the model uses
    alibi: str | None = None  # "bloom": scores*scale + alibi; "falcon": (scores + alibi)*scale; "mpt": like bloom


F = fused.CASES
S = split.CASES
CASES = {
    "gpt2": Case(F["gpt2"].config, "h", "attn"),
    "gpt_neox": Case(F["gpt_neox"].config, "layers", "attention", rotary="gpt_neox"),
    "bloom": Case(F["bloom"].config, "h", "self_attention", alibi="bloom"),
    "falcon-gqa": Case(F["falcon-gqa"].config, "h", "self_attention", rotary="falcon"),
    "falcon-mqa": Case(F["falcon-mqa"].config, "h", "self_attention", rotary="falcon"),
    "falcon-mha-alibi": Case(F["falcon-mha-alibi"].config, "h", "self_attention", alibi="falcon"),
    "mpt": Case(F["mpt"].config, "blocks", "attn", alibi="mpt"),
    "phi3": Case(F["phi3"].config, "layers", "self_attn", rotary="phi3"),
    "llama": Case(S["llama"].config, "layers", "self_attn", rotary="llama"),
    "gpt_neo-local": Case(S["gpt_neo"].config, "h", "attn.attention"),
    "gemma2": Case(S["gemma2"].config, "layers", "self_attn", rotary="gemma2"),
    "mistral-sliding": Case(S["mistral"].config, "layers", "self_attn", rotary="mistral"),
    "phi3-sliding": Case(tf.Phi3Config(**{**F["phi3"].config.to_diff_dict(), "sliding_window": 3}), "layers",
                         "self_attn", rotary="phi3"),
    "gptj-interleaved-partial": Case(S["gptj"].config, "h", "attn", rotary="gptj"),
    "gpt2-inverse-layer-scale": Case(tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=V, n_positions=32,
                                                   scale_attn_by_inverse_layer_idx=True), "h", "attn"),
}


def get_attr(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def gptj_rotary(q, k, rot: int):
    """GPT-J's rotation written out from its definition, since transformers keeps its sin/cos table private: on the
    first `rot` dims each adjacent pair (2i, 2i+1) of a query or key (B, n, T, d) at position t turns by the angle
    t / 10000^(2i/rot); the other dims pass through. Positions are 0..T-1 (the forward pass is given none)."""
    inv = 10000.0 ** (-torch.arange(0, rot, 2, dtype=torch.float64) / rot)  # (rot/2,)
    angle = torch.arange(q.shape[2], dtype=torch.float64)[:, None] * inv  # (T, rot/2)
    cos, sin = angle.cos(), angle.sin()
    out = []
    for t in (q, k):
        x1, x2 = t[..., 0:rot:2], t[..., 1:rot:2]  # (B, n, T, rot/2) each: the pairs' two coordinates
        turned = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (B, n, T, rot/2, 2)
        out.append(torch.cat([turned.flatten(-2), t[..., rot:]], dim=-1))  # (B, n, T, rot/2, 2) -> (B, n, T, d)
    return out


def positional_terms(case: Case, attn, attn_kwargs: dict, q, k, spec):
    """Apply the model's own rotary function, or return the model's own ALiBi bias (B, H, 1, T)."""
    H = spec.n_heads
    if case.rotary == "gptj":
        return (*gptj_rotary(q, k, spec.rotary_dims), None)
    if case.rotary:
        mod = importlib.import_module(f"transformers.models.{case.rotary}.modeling_{case.rotary}")
        cos, sin = (t.double() for t in attn_kwargs["position_embeddings"])
        q, k = mod.apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, None
    if case.alibi:
        bias = attn_kwargs["position_bias" if case.alibi == "mpt" else "alibi"].double()
        if case.alibi == "mpt":
            return q, k, bias[None, :, :, -q.shape[2]:]  # (H, 1, max_len) -> (1, H, 1, T)
        return q, k, bias.view(-1, H, 1, bias.shape[-1])  # (B*H, 1, T) -> (B, H, 1, T)
    return q, k, None


def our_probabilities(case: Case, ours, attn, x, attn_kwargs) -> torch.Tensor:
    """softmax(scale * q_h . k_{h // rep} + positional terms), causal, from canonical matrices only."""
    s = ours.spec
    q = per_head(x.double(), ours.W_Q.double(), None if ours.b_Q is None else ours.b_Q.double())
    k = per_head(x.double(), ours.W_K.double(), None if ours.b_K is None else ours.b_K.double())
    q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, T, n, d) -> (B, n, T, d)
    q, k, alibi = positional_terms(case, attn, attn_kwargs, q, k, s)
    k = k[:, ours.kv_index()]  # (B, G, T, d) -> (B, H, T, d): query head h reads KV head h // rep
    raw = q @ k.transpose(-1, -2)  # (B, H, T, T)
    if alibi is not None and case.alibi == "falcon":
        # FalconModel (transformers 5) also folds alibi / sqrt(d) into the mask it hands every layer, and the
        # eager path adds alibi again: take the model's own mask, which carries the causal part too.
        scores = (raw + alibi) * s.score_scale + attn_kwargs["attention_mask"].double()
        return scores.softmax(-1)
    scores = raw * s.score_scale + (0 if alibi is None else alibi)
    cap = ours.extra.get("attn_logit_softcapping")
    if cap:
        scores = cap * torch.tanh(scores / cap)
    allowed = torch.ones(q.shape[2], q.shape[2], dtype=torch.bool).tril()
    window = ours.extra.get("window_size") or ours.extra.get("sliding_window")  # GPT-Neo local / Mistral, Phi-3
    if window:
        allowed &= ~allowed.tril(-window)  # a query sees itself and the window - 1 keys before it
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1)


@pytest.mark.parametrize("name", sorted(CASES))
def test_attention_probabilities_from_canonical_matrices(name, tmp_path):
    case = CASES[name]
    torch.manual_seed(0)
    model = randomize(tf.AutoModel.from_config(case.config, attn_implementation="eager"))
    layers = load_layers(save_tiny(model, tmp_path / "m"))
    ids = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(1))
    blocks = get_attr(model, case.layers)
    attns = [get_attr(b, case.attn) for b in blocks]
    with capture(*attns) as rec, torch.no_grad():
        out = model(ids, output_attentions=True)
    for ours, attn, r in zip(layers, attns, rec, strict=True):
        args, kwargs, _ = r[0]
        x = args[0] if args else kwargs["hidden_states"]
        want = out.attentions[ours.layer]
        assert want[..., -1, :].amax(-1).mean() > 2 / T, "probabilities too flat to tell wrong matrices from right"
        got = our_probabilities(case, ours, attn, x, kwargs)
        assert_close(got, want, f"{name} layer {ours.layer} probabilities")
