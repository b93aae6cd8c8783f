"""Pre-LN encoder-decoders with BART's names (mBART, Pegasus): three blocks reproduce the model's own projections,
each self-attention reads its own self_attn_layer_norm, cross-attention queries its encoder_attn_layer_norm and
keys/values the encoder output (the encoder's final layer_norm); probabilities pin the scale."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as tf

from qkinspect.metrics.fold import fold_ln
from tests.adapters.harness import RTOL, assert_probs, per_head, relative_error
from tests.adapters.test_enc_seq2seq import (
    BART_SMALL,
    Case,
    bart_sites,
    build_and_load,
    built_and_run,
    run_all,
    text2text,
)

BLOCKS = {"encoder": 2, "decoder": 3, "cross": 3}
CONFIGS = {"mbart": tf.MBartConfig(**BART_SMALL), "pegasus": tf.PegasusConfig(**BART_SMALL)}  # test_config reads these


def fresh(name: str):
    """A copy of the shared config, so that a model (set_attn_implementation ...) never changes the original."""
    return copy.deepcopy(CONFIGS[name])


CASES = {
    "mbart": Case(lambda: tf.MBartModel(fresh("mbart")), text2text, bart_sites, BLOCKS),
    # Saved from the generation class: names carry a "model." prefix.
    "mbart-generation": Case(lambda: tf.MBartForConditionalGeneration(fresh("mbart")), text2text, bart_sites,
                             BLOCKS),
    "pegasus": Case(lambda: tf.PegasusModel(fresh("pegasus")), text2text, bart_sites, BLOCKS),
}


def stack(model, block: str):
    m = getattr(model, "model", model)
    return m.encoder if block == "encoder" else m.decoder


def norm_modules(model, lay):
    """The LayerNorm modules whose outputs the layer's queries and keys/values read, found in the model."""
    layer = stack(model, lay.block).layers[lay.layer]
    if lay.block == "cross":
        return layer.encoder_attn_layer_norm, stack(model, "encoder").layer_norm
    return layer.self_attn_layer_norm, layer.self_attn_layer_norm


@pytest.mark.parametrize("name", sorted(CASES))
def test_reproduces_projections_and_norms(name, tmp_path):
    case = CASES[name]
    model, layers, out, inputs = built_and_run(case, tmp_path)
    for lay in layers:
        nq, nkv = norm_modules(model, lay)
        assert torch.equal(lay.norm_q.weight, nq.weight) and torch.equal(lay.norm_q.bias, nq.bias)
        assert torch.equal(lay.norm_kv.weight, nkv.weight) and torch.equal(lay.norm_kv.bias, nkv.bias)
        if lay.block == "cross":
            assert torch.equal(inputs[("cross", lay.layer)]["x_kv"], out.encoder_last_hidden_state)
        else:
            assert lay.norm_kv is lay.norm_q


@pytest.mark.parametrize("name", ["mbart", "pegasus"])
def test_reproduces_attention_probabilities(name, tmp_path):
    case = CASES[name]
    model, layers = build_and_load(case, tmp_path)
    model.set_attn_implementation("eager")
    out, inputs = run_all(case, model, layers, output_attentions=True)
    probs = {"encoder": out.encoder_attentions, "decoder": out.decoder_attentions, "cross": out.cross_attentions}
    for lay in layers:
        x = inputs[(lay.block, lay.layer)]
        assert_probs(lay, x["x_q"], x["x_kv"], probs[lay.block][lay.layer], causal=lay.block == "decoder",
                     what=f"{name} {lay.block} layer {lay.layer}")


@pytest.mark.parametrize("name", ["mbart", "pegasus"])
def test_fold_ln_reproduces_projections_from_the_normalised_stream(name, tmp_path):
    """--fold-ln: the folded matrices applied to the un-scaled, un-shifted normalised input give the same states."""
    case = CASES[name]
    model, layers = build_and_load(case, tmp_path)
    _, inputs = run_all(case, model, layers)
    for lay in layers:
        folded = fold_ln(lay)
        for side, W, b, fW, fb, norm in (("x_q", lay.W_Q, lay.b_Q, folded.W_Q, folded.b_Q, lay.norm_q),
                                         ("x_kv", lay.W_K, lay.b_K, folded.W_K, folded.b_K, lay.norm_kv),
                                         ("x_kv", lay.W_V, lay.b_V, folded.W_V, folded.b_V, lay.norm_kv)):
            x = inputs[(lay.block, lay.layer)][side].double()
            n = (x - norm.bias.double()) / norm.weight.double()  # the model's normalised stream
            got = per_head(n, fW.double(), fb.double())
            want = per_head(x, W.double(), b.double())
            assert relative_error(got, want) <= RTOL, (name, lay.block, lay.layer, side)
