"""SigLIP: the text and vision towers reproduce the model's own projections, probabilities and pre-attention norms
(as CLIP's), and the vision tower's attention-pooling head (a fused nn.MultiheadAttention whose query is a learned
probe) comes out as the "pooling" block, reproducing the module's own per-head probabilities and output."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as tf

from qkinspect.errors import InputError
from qkinspect.loading import open_model
from qkinspect.metrics.fold import fold_ln
from tests.adapters.harness import (
    assert_close,
    assert_normalised,
    assert_probs,
    attention_probs,
    capture,
    check_layers,
    load_layers,
    output_proj,
    per_head,
    randomise_,
    save_tiny,
)
from tests.adapters.test_encoders import SMALL, Case, both, clip_sites, pixels, text

TOKENS = dict(bos_token_id=0, eos_token_id=2, pad_token_id=1, projection_size=48)  # = the vision width
VISION = dict(**{**SMALL, "hidden_size": 48, "num_hidden_layers": 3}, image_size=16, patch_size=8)
CONFIGS = {  # test_config reads these
    "siglip": tf.SiglipConfig(text_config=dict(**SMALL, **TOKENS), vision_config=VISION),
    "siglip_text_model": tf.SiglipTextConfig(**SMALL, **TOKENS),
    "siglip_vision_model": tf.SiglipVisionConfig(**VISION),
    "siglip-no-head": tf.SiglipVisionConfig(**VISION, vision_use_head=False),
    "siglip-classifier": tf.SiglipConfig(text_config=dict(**SMALL, **TOKENS), vision_config=VISION,
                                         architectures=["SiglipForImageClassification"]),
}


def fresh(name: str):
    return copy.deepcopy(CONFIGS[name])


def towers(o) -> dict:
    return {"text": o.text_model_output.attentions, "vision": o.vision_model_output.attentions}


CASES = {
    "siglip": Case(lambda: tf.SiglipModel(fresh("siglip")), both, clip_sites,
                   {"text": 2, "vision": 3, "pooling": 1}, attentions=towers),
    "siglip_text_model": Case(lambda: tf.SiglipTextModel(fresh("siglip_text_model")), text, clip_sites, {"text": 2},
                              attentions=lambda o: {"text": o.attentions}),
    "siglip_vision_model": Case(lambda: tf.SiglipVisionModel(fresh("siglip_vision_model")), pixels, clip_sites,
                                {"vision": 3, "pooling": 1}, attentions=lambda o: {"vision": o.attentions}),
    "siglip-no-head": Case(lambda: tf.SiglipVisionModel(fresh("siglip-no-head")), pixels, clip_sites, {"vision": 3},
                           attentions=lambda o: {"vision": o.attentions}),
    "siglip-classifier": Case(lambda: tf.SiglipForImageClassification(fresh("siglip-classifier")), pixels,
                              clip_sites, {"vision": 3, "pooling": 1}, attentions=None),
}


def build_and_load(name: str, tmp_path):
    torch.manual_seed(0)
    model = randomise_(CASES[name].build())
    return model, load_layers(save_tiny(model, tmp_path / "m"))


def vision_tower(model):
    return getattr(model, "vision_model", model)


def tower_layers(layers):
    return [lay for lay in layers if lay.block != "pooling"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_towers_reproduce_projections_and_norms(name, tmp_path):
    case = CASES[name]
    model, layers = build_and_load(name, tmp_path)
    got: dict[str, int] = {}
    for lay in layers:
        got[lay.block] = got.get(lay.block, 0) + 1
    assert got == case.blocks
    model.set_attn_implementation("eager")
    outs = []
    inputs = check_layers(model, lambda m: outs.append(case.run(m, output_attentions=True)), tower_layers(layers),
                          lambda b, i: case.sites(vision_tower(model) if b == "vision" else model, b, i))
    for lay in tower_layers(layers):
        assert lay.norm_q is not None and lay.norm_kv is lay.norm_q  # layer_norm1, checked in check_layers
        # --fold-ln: the folded matrices applied to the normalised stream give the same queries, keys and values.
        x = inputs[(lay.block, lay.layer)]["x_q"].double()
        n = (x - lay.norm_q.bias.double()) / lay.norm_q.weight.double()
        folded = fold_ln(lay)
        for W, b in (("W_Q", "b_Q"), ("W_K", "b_K"), ("W_V", "b_V")):
            assert_close(per_head(n, getattr(folded, W).double(), getattr(folded, b).double()),
                         per_head(x, getattr(lay, W).double(), getattr(lay, b).double()), f"{lay.block} fold {W}")
    if case.attentions is None:
        return
    probs = case.attentions(outs[0])
    for lay in tower_layers(layers):  # bidirectional in both towers (SigLIP's text tower has no causal mask)
        x = inputs[(lay.block, lay.layer)]
        assert_probs(lay, x["x_q"], x["x_kv"], probs[lay.block][lay.layer], what=f"{name} {lay.block} {lay.layer}")


@pytest.mark.parametrize("name", ["siglip", "siglip_vision_model", "siglip-classifier"])
def test_pooling_head_reproduces_the_module(name, tmp_path):
    """The probe through W_Q, the encoder output through W_K and W_V: softmax(q kᵀ/√d) per head equals the module's
    own per-head probabilities, and Σ_h P_h v_h W_O[h] + b_O its output."""
    model, layers = build_and_load(name, tmp_path)
    (lay,) = [lay for lay in layers if lay.block == "pooling"]
    head = vision_tower(model).head
    with torch.no_grad(), capture(head.attention) as rec:
        CASES[name].run(model)
    args, kwargs, out = rec[0][0]
    probe, x_kv = args[0], args[1]
    assert torch.equal(probe[0], head.probe[0]) and torch.equal(args[2], x_kv)
    assert lay.spec.name == "cross" and lay.spec.key == "pooling" and lay.norm_q is None
    assert_normalised(x_kv, lay.norm_kv, "pooling key/value input")  # post_layernorm
    with torch.no_grad():
        _, own = head.attention(probe, x_kv, x_kv, need_weights=True, average_attn_weights=False)  # (B, H, 1, S)
    p = attention_probs(lay, probe, x_kv)
    assert_close(p, own, "pooling probabilities")
    v = per_head(x_kv.double(), lay.W_V.double(), lay.b_V.double())  # (B, S, H, dv)
    z = torch.einsum("bhts,bshd->bthd", p, v)
    assert_close(output_proj(z, lay.W_O, lay.b_O), out[0], "pooling output")


def test_pooling_block_flags_and_fold_refusal(tmp_path):
    model, layers = build_and_load("siglip", tmp_path)
    with open_model(tmp_path / "m") as m:
        keys = [b.key for b in m.info.blocks]
        pooling = m.info.block("pooling")
    assert keys == ["text", "vision", "pooling"]
    assert (pooling.n_layers, pooling.n_heads, pooling.d_model, pooling.d_head) == (1, 4, 48, 12)
    assert pooling.kv_width == 48
    (lay,) = [lay for lay in layers if lay.block == "pooling"]
    with pytest.raises(InputError, match="no norm before the query"):
        fold_ln(lay)
