"""DeBERTa v1: the canonical matrices reproduce the query, key and value states the model splits out of its fused
``in_proj`` (and adds q_bias / v_bias to), its output projection and the LayerNorm feeding attention (hence
--fold-ln); its attention probabilities are rebuilt from W_Q, W_K, the recorded scale and, where the model has
them, the c2p/p2c terms computed by the model's own code from *our* queries and keys."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import transformers as tf

from qkinspect.loading import open_model
from qkinspect.metrics.fold import fold_ln
from tests.adapters.harness import (
    Sites,
    assert_close,
    capture,
    check_layers,
    load_layers,
    per_head,
    randomise_,
    record_input,
    save_tiny,
    split_heads,
)
from tests.adapters.test_encoders import SMALL, text

RELATIVE = dict(relative_attention=True, pos_att_type=["c2p", "p2c"], position_biased_input=False,
                max_relative_positions=16)
CONFIGS = {  # test_config reads these
    "deberta": tf.DebertaConfig(**SMALL, **RELATIVE),  # microsoft/deberta-base's layout
    "deberta-plain": tf.DebertaConfig(**SMALL),
    "deberta-scaled": tf.DebertaConfig(**SMALL, pos_att_type=["c2p", "p2c"]),  # no relative terms, sqrt(3d)
    "deberta-c2p": tf.DebertaConfig(**SMALL, **{**RELATIVE, "pos_att_type": ["c2p"]}),
    "deberta-talking": tf.DebertaConfig(**SMALL, **RELATIVE, talking_head=True),
    "deberta-embed-proj": tf.DebertaConfig(**SMALL, embedding_size=32),  # embed_proj before embeddings.LayerNorm
}
MODELS = {"deberta-mlm": (tf.DebertaForMaskedLM, "deberta")}  # saved with the "deberta." prefix
CASES = sorted(CONFIGS) + sorted(MODELS)
WITH_PROBS = sorted(n for n in CONFIGS if n != "deberta-talking")  # talking heads mix the heads' scores


def build_and_load(name: str, tmp_path):
    torch.manual_seed(0)
    cls, config = MODELS.get(name, (tf.DebertaModel, name))
    model = randomise_(cls(copy.deepcopy(CONFIGS[config])))
    return model, load_layers(save_tiny(model, tmp_path / "m"))


def base(model):
    return getattr(model, "deberta", model)


def sites(model, block: str, i: int) -> Sites:
    a = base(model).encoder.layer[i].attention

    def split(y):
        """DisentangledSelfAttention.forward: (B, T, 3*H*d) -> q, k, v each (B, T, H*d), with its biases."""
        s = a.self
        q, k, v = s.transpose_for_scores(y).chunk(3, dim=-1)  # (B, H, T, 3d) -> 3 x (B, H, T, d)
        q = q + s.transpose_for_scores(s.q_bias[None, None, :])
        v = v + s.transpose_for_scores(s.v_bias[None, None, :])
        return tuple(t.transpose(1, 2).flatten(2) for t in (q, k, v))  # (B, H, T, d) -> (B, T, H*d)

    return Sites(a.self.in_proj, a.self.in_proj, a.self.in_proj, a.output.dense, split)


@pytest.mark.parametrize("name", CASES)
def test_reproduces_projections_norms_and_fold(name, tmp_path):
    model, layers = build_and_load(name, tmp_path)
    assert [(lay.block, lay.layer) for lay in layers] == [("encoder", 0), ("encoder", 1)]
    inputs = check_layers(model, text, layers, lambda b, i: sites(model, b, i))
    enc = base(model).encoder
    for lay in layers:
        own = base(model).embeddings.LayerNorm if lay.layer == 0 else enc.layer[lay.layer - 1].output.LayerNorm
        assert torch.equal(lay.norm_q.weight, own.weight) and torch.equal(lay.norm_q.bias, own.bias)
        assert lay.norm_kv is lay.norm_q and lay.b_K is None and lay.b_Q is not None and lay.b_V is not None
        x = inputs[("encoder", lay.layer)]["x_q"].double()
        n = (x - lay.norm_q.bias.double()) / lay.norm_q.weight.double()
        folded = fold_ln(lay)  # --fold-ln: the folded matrices on the normalised stream give the same states
        for W, b in (("W_Q", "b_Q"), ("W_K", "b_K"), ("W_V", "b_V")):
            ob = getattr(lay, b)
            assert_close(per_head(n, getattr(folded, W).double(), getattr(folded, b).double()),
                         per_head(x, getattr(lay, W).double(), None if ob is None else ob.double()),
                         f"{name} layer {lay.layer} fold {W}")


def our_probs(model, lay, x: torch.Tensor) -> torch.Tensor:
    """softmax(score_scale * q kᵀ + c2p + p2c) (B, H, T, T) from our q, k; the relative terms by the model's own
    disentangled_att_bias, which receives the query already divided by the scale, as the model passes it."""
    att = base(model).encoder.layer[lay.layer].attention.self
    s = lay.spec
    q = per_head(x.double(), lay.W_Q.double(), lay.b_Q.double()).transpose(1, 2)  # (B, T, H, d) -> (B, H, T, d)
    k = per_head(x.double(), lay.W_K.double(), None).transpose(1, 2)
    q = q * s.score_scale
    scores = q @ k.transpose(-1, -2)  # (B, H, T, T)
    if s.positional == "relative":
        enc = base(model).encoder
        factor = round(1 / (s.score_scale**2 * s.d_head))  # 1 + len(pos_att_type), from the recorded scale
        rel = tf.models.deberta.modeling_deberta.build_relative_position(x, x)
        with torch.no_grad():  # the model's float32 code on our (float64) states
            rel_att = att.disentangled_att_bias(q.float(), k.float(), rel, enc.rel_embeddings.weight, factor)
        scores = scores + rel_att.double()
    return scores.softmax(-1)


@pytest.mark.parametrize("name", WITH_PROBS)
def test_reproduces_attention_probabilities_and_context(name, tmp_path):
    """The probabilities pin the scale (and q_bias); probabilities times our values pin v_bias."""
    model, layers = build_and_load(name, tmp_path)
    denses = [base(model).encoder.layer[lay.layer].attention.output.dense for lay in layers]
    outs, contexts = [], []

    def run(m):
        with capture(*denses) as rec:
            outs.append(text(m, output_attentions=True))
        contexts.extend(record_input(r[0]) for r in rec)  # each layer's context: the output projection's input

    inputs = check_layers(model, run, layers, lambda b, i: sites(model, b, i))
    for lay in layers:
        x = inputs[("encoder", lay.layer)]["x_q"]
        p = our_probs(model, lay, x)
        assert_close(p, outs[0].attentions[lay.layer], f"{name} layer {lay.layer} probabilities")
        v = per_head(x.double(), lay.W_V.double(), lay.b_V.double())  # (B, T, H, d)
        z = torch.einsum("bhts,bshd->bthd", p, v)
        ctx = split_heads(contexts[lay.layer], lay.spec.n_heads, lay.spec.d_head)  # (B, T, H*d) -> (B, T, H, d)
        assert_close(z, ctx, f"{name} layer {lay.layer} context")


def test_records_scale_positions_and_flags(tmp_path):
    d = SMALL["hidden_size"] // SMALL["num_attention_heads"]
    expect = {"deberta": ("relative", 3, "full"), "deberta-plain": ("absolute", 1, "full"),
              "deberta-scaled": ("absolute", 3, "full"), "deberta-c2p": ("relative", 2, "full"),
              "deberta-talking": ("relative", 3, "talking-heads")}
    for name, (positional, factor, kind) in expect.items():
        model = randomise_(tf.DebertaModel(copy.deepcopy(CONFIGS[name])))
        with open_model(save_tiny(model, tmp_path / name)) as m:
            (spec,) = m.info.blocks
        assert spec.positional == positional and spec.attention_kind == kind, name
        assert math.isclose(spec.score_scale, (d * factor) ** -0.5), name
        assert (kind in spec.flags()) == (kind != "full"), name
