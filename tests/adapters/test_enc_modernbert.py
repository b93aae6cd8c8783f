"""ModernBERT: fused Wqkv sectioned [q | k | v], rotary positions with a different base on global and sliding
layers. The canonical matrices reproduce the model's q, k, v states and, with the model's own rotary applied to
both sides, its attention probabilities."""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from transformers.models.modernbert import modeling_modernbert as mb

from qkinspect.loading import open_model
from tests.adapters.harness import (
    RTOL,
    Sites,
    capture,
    check_layers,
    load_layers,
    per_head,
    randomise_,
    relative_error,
    save_tiny,
)

H, D = 4, 64
d = D // H


def build(bias: bool) -> torch.nn.Module:
    cfg = tf.ModernBertConfig(
        hidden_size=D, num_hidden_layers=3, num_attention_heads=H, intermediate_size=64, vocab_size=99,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, global_attn_every_n_layers=2,
        local_attention=16, attention_bias=bias, norm_bias=bias)
    torch.manual_seed(0)
    model = randomise_(tf.ModernBertModel(cfg))
    model.set_attn_implementation("eager")
    return model


def run(model, **kw):
    return model(input_ids=torch.randint(3, 99, (2, 7), generator=torch.Generator().manual_seed(1)), **kw)


def split(out: torch.Tensor):
    """The model's own split: qkv.view(..., 3, H, d).unbind(-3), each flattened back to (..., H*d)."""
    q, k, v = out.view(*out.shape[:-1], 3, H, d).unbind(-3)  # (..., 3*H*d) -> 3 x (..., H, d)
    return q.flatten(-2), k.flatten(-2), v.flatten(-2)  # (..., H, d) -> (..., H*d)


def sites(model, block, i):
    a = model.layers[i].attn
    return Sites(a.Wqkv, a.Wqkv, a.Wqkv, a.Wo, split=split)


@pytest.fixture(scope="module", params=[False, True], ids=["no-bias", "bias"])
def loaded(request, tmp_path_factory):
    model = build(request.param)
    return model, load_layers(save_tiny(model, tmp_path_factory.mktemp("modernbert") / "m"))


def test_reproduces_projections(loaded):
    model, layers = loaded
    check_layers(model, run, layers, lambda b, i: sites(model, b, i))
    has_bias = model.config.attention_bias
    assert all((lay.b_Q is not None) == has_bias and (lay.b_O is not None) == has_bias for lay in layers)
    assert all(lay.norm_q is not None and (lay.norm_q.bias is not None) == has_bias for lay in layers)


def test_reproduces_attention_probabilities(loaded):
    """softmax(scale * R(q) R(k)^T) with q, k from qkinspect's W_Q/W_K and the layer input, R the model's rotary."""
    model, layers = loaded
    attns = [model.layers[i].attn for i in range(3)]
    with torch.no_grad(), capture(*attns) as recs:
        out = run(model, output_attentions=True)
    for lay in layers:
        args, kwargs, _ = recs[lay.layer][0]
        x = args[0] if args else kwargs["hidden_states"]  # (B, T, D), after attn_norm
        cos, sin = kwargs["position_embeddings"]
        q = per_head(x, lay.W_Q, lay.b_Q).transpose(1, 2)  # (B, T, H, d) -> (B, H, T, d)
        k = per_head(x, lay.W_K, lay.b_K).transpose(1, 2)
        q, k = mb.apply_rotary_pos_emb(q, k, cos, sin)
        probs = (q @ k.transpose(-1, -2) * lay.spec.score_scale).softmax(-1)  # (B, H, T, T)
        err = relative_error(probs, out.attentions[lay.layer])
        assert err <= RTOL, f"layer {lay.layer}: probabilities relative error {err:.3g}"
        # The recorded rotary base is the one the model used on this layer.
        theta = lay.extra["rope_theta"]
        inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        angles = torch.arange(7, dtype=torch.float64)[:, None] * inv  # (T, d/2)
        assert torch.allclose(cos[0].double(), torch.cat([angles, angles], -1).cos(), atol=1e-6)


def test_layer_kinds(loaded, tmp_path):
    model, layers = loaded
    assert [lay.spec.attention_kind for lay in layers] == ["full", "sliding", "full"]
    assert [lay.extra.get("window") for lay in layers] == [None, 16, None]
    assert layers[0].extra["rope_theta"] != layers[1].extra["rope_theta"]
    assert all(lay.spec.positional == "rope" and lay.spec.rotary_dims == d for lay in layers)
    model.save_pretrained(tmp_path / "m")
    with open_model(tmp_path / "m") as m:
        assert m.info.blocks[0].attention_kind == "full+sliding"
