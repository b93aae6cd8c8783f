"""GPT-2 with cross-attention (GPT2Config(add_cross_attention=True)): besides the "decoder" block, a "cross" block whose
queries read the decoder stream through ln_cross_attn and whose keys and values read the raw encoder_hidden_states.
A forward pass with encoder_hidden_states: both blocks reproduce the model's own q/k/v states (split by the model's
own code), output projections, norms and attention probabilities (the cross ones non-causal, with each layer's
scale); --fold-ln refuses the cross block, which has no norm before its keys."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as tf

from qkinspect.errors import InputError
from qkinspect.loading import open_model
from qkinspect.metrics.fold import fold_ln
from tests.adapters.harness import (
    Sites,
    assert_heads,
    assert_normalised,
    assert_out_proj,
    assert_probs,
    capture,
    check_layers,
    load_layers,
    randomize,
    record_input,
    record_output,
    save_tiny,
    split_heads,
)

D, L, H, T, S, V = 64, 2, 4, 7, 5, 99
CONFIGS = {  # test_config reads these
    "gpt2-cross": tf.GPT2Config(n_embd=D, n_layer=L, n_head=H, vocab_size=V, n_positions=32, add_cross_attention=True),
    "gpt2-cross-inverse": tf.GPT2Config(n_embd=D, n_layer=L, n_head=H, vocab_size=V, n_positions=32,
                                        add_cross_attention=True, scale_attn_by_inverse_layer_idx=True),
}
MODELS = {"gpt2-cross": tf.GPT2Model, "gpt2-cross-inverse": tf.GPT2Model, "gpt2-cross-lm": tf.GPT2LMHeadModel}


def build_and_load(name: str, tmp_path):
    torch.manual_seed(0)
    config = copy.deepcopy(CONFIGS["gpt2-cross" if name == "gpt2-cross-lm" else name])
    model = randomize(MODELS[name](config))
    model.set_attn_implementation("eager")
    return model, load_layers(save_tiny(model, tmp_path / "m"))


def inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, V, (2, T), generator=g), torch.randn(2, S, D, generator=g)


def blocks(model):
    return getattr(model, "transformer", model).h


def self_sites(model, block: str, i: int) -> Sites:
    a = blocks(model)[i].attn
    return Sites(a.c_attn, a.c_attn, a.c_attn, a.c_proj, split=lambda y: y.split(a.split_size, dim=2))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_both_blocks_reproduce_the_model(name, tmp_path):
    model, layers = build_and_load(name, tmp_path)
    assert [(lay.block, lay.layer) for lay in layers] == [("decoder", 0), ("decoder", 1), ("cross", 0), ("cross", 1)]
    ids, enc = inputs()
    cross_mods = [m for b in blocks(model) for m in (b.crossattention.q_attn, b.crossattention.c_attn,
                                                     b.crossattention.c_proj)]
    outs, recs = [], []

    def run(m):
        with capture(*cross_mods) as rec:
            outs.append(m(input_ids=ids, encoder_hidden_states=enc, output_attentions=True))
        recs.extend(rec)

    own = [lay for lay in layers if lay.block == "decoder"]
    x = check_layers(model, run, own, lambda b, i: self_sites(model, b, i))
    out = outs[0]
    for lay in own:
        xi = x[("decoder", lay.layer)]
        assert_probs(lay, xi["x_q"], xi["x_kv"], out.attentions[lay.layer], causal=True, what=f"decoder {lay.layer}")
    for lay in (lay for lay in layers if lay.block == "cross"):
        check_cross(model, lay, recs[3 * lay.layer: 3 * lay.layer + 3], enc, out.cross_attentions[lay.layer])


def check_cross(model, lay, recs, enc, probs):
    """One cross layer against the captured calls of its q_attn, c_attn and c_proj."""
    q_rec, kv_rec, o_rec = (r[0] for r in recs)
    what, s = f"cross layer {lay.layer}", lay.spec
    x_q, x_kv = record_input(q_rec), record_input(kv_rec)
    assert torch.equal(x_kv, enc), f"{what}: keys/values read the encoder states as given"
    k, v = record_output(kv_rec).split(model.config.n_embd, dim=2)  # GPT2Attention.forward: [k | v]
    assert_heads(x_q, lay.W_Q, lay.b_Q, split_heads(record_output(q_rec), s.n_heads, s.d_head), f"{what} queries")
    assert_heads(x_kv, lay.W_K, lay.b_K, split_heads(k, s.n_kv_heads, s.d_head), f"{what} keys")
    assert_heads(x_kv, lay.W_V, lay.b_V, split_heads(v, s.n_kv_heads, s.d_head), f"{what} values")
    assert_out_proj(record_input(o_rec), lay.W_O, lay.b_O, record_output(o_rec), what)
    ln = blocks(model)[lay.layer].ln_cross_attn
    assert torch.equal(lay.norm_q.weight, ln.weight) and torch.equal(lay.norm_q.bias, ln.bias)
    assert_normalised(x_q, lay.norm_q, f"{what} query input")
    assert lay.norm_kv is None
    assert_probs(lay, x_q, x_kv, probs, causal=False, what=what)  # pins the per-layer scale too


def test_cross_block_spec_and_fold_refusal(tmp_path):
    _, layers = build_and_load("gpt2-cross-inverse", tmp_path)
    with open_model(tmp_path / "m") as m:
        assert [b.key for b in m.info.blocks] == ["decoder", "cross"]
        cross = m.info.block("cross")
    assert (cross.name, cross.n_layers, cross.n_heads, cross.d_model, cross.kv_width) == ("cross", L, H, D, D)
    by = {(lay.block, lay.layer): lay for lay in layers}
    for i in range(L):  # each cross layer carries its decoder layer's scale: 1/sqrt(d) / (layer + 1)
        assert by[("cross", i)].spec.score_scale == by[("decoder", i)].spec.score_scale == (D // H) ** -0.5 / (i + 1)
        assert by[("cross", i)].W_K.shape == (H, D, D // H)
    fold_ln(by[("decoder", 0)])  # the self-attention block folds
    with pytest.raises(InputError, match="no norm before the key/value"):
        fold_ln(by[("cross", 0)])


def test_without_cross_attention_one_block(tmp_path):
    config = copy.deepcopy(CONFIGS["gpt2-cross"])
    config.add_cross_attention = False
    model = randomize(tf.GPT2Model(config))
    layers = load_layers(save_tiny(model, tmp_path / "m"))
    assert {lay.block for lay in layers} == {"decoder"}
