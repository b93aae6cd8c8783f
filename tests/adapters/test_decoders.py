"""Decoder-only families with separate q/k/v/o projections: the canonical matrices reproduce the model's own
query, key and value states (captured on the projection modules in a real forward pass, so before any rotary
embedding), the output projection, and the pre-attention norm used by --fold-ln."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
import transformers as tf

from qkinspect.loading import open_model
from tests.adapters.harness import (
    apply_norm,
    assert_close,
    assert_heads,
    capture,
    load_layers,
    output_proj,
    randomize,
    save_tiny,
    split_heads,
)

D, L, H, G, V = 64, 2, 4, 2, 99


@dataclass
class Case:
    config: tf.PretrainedConfig
    attn: str = "self_attn"  # attribute of a decoder layer holding the attention module
    proj: tuple[str, str, str, str] = ("q_proj", "k_proj", "v_proj", "o_proj")
    norm: str | None = "input_layernorm"  # attribute of a decoder layer: the norm feeding attention
    layers: str = "layers"  # attribute path from the base model to its list of layers
    expect: dict = field(default_factory=dict)  # BlockSpec fields the adapter must set


def llama_like(cls, **kw):
    base = dict(hidden_size=D, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=G,
                intermediate_size=64, vocab_size=V)
    return cls(**{**base, **kw})


CASES = {
    "llama": Case(llama_like(tf.LlamaConfig), expect=dict(n_kv_heads=G, positional="rope", rotary_dims=16)),
    "llama-bias": Case(llama_like(tf.LlamaConfig, attention_bias=True, num_key_value_heads=1),
                       expect=dict(n_kv_heads=1)),
}


def build(case: Case, tmp_path):
    torch.manual_seed(0)
    model = tf.AutoModel.from_config(case.config, attn_implementation="eager")
    randomize(model)
    path = save_tiny(model, tmp_path / "m")
    return model, path


def get_attr(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def watched(case: Case, block) -> list[torch.nn.Module]:
    """q, k, v, o projection modules of one decoder layer, then its pre-attention norm if it has one."""
    attn = getattr(block, case.attn)
    mods = [getattr(attn, p) for p in case.proj]
    return mods + ([getattr(block, case.norm)] if case.norm else [])


def check_layer(ours, rec, norm_module) -> None:
    """Compare one layer's canonical matrices with the projections captured in the model's own forward pass."""
    (xq, _, q), (xk, _, k), (xv, _, v), (xo, _, o) = (r[0] for r in rec[:4])
    s, i = ours.spec, ours.layer
    assert_heads(xq[0], ours.W_Q, ours.b_Q, split_heads(q, s.n_heads, s.d_head), f"layer {i} Q")
    assert_heads(xk[0], ours.W_K, ours.b_K, split_heads(k, s.n_kv_heads, s.d_head), f"layer {i} K")
    assert_heads(xv[0], ours.W_V, ours.b_V, split_heads(v, s.n_kv_heads, s.v_head), f"layer {i} V")
    z = split_heads(xo[0], s.n_heads, s.v_head)  # (B, T, H*dv) -> (B, T, H, dv)
    assert_close(output_proj(z, ours.W_O, ours.b_O), o, f"layer {i} O")
    if norm_module is None:
        assert ours.norm_q is None
        return
    (y,), _, y_out = rec[4][0]
    eps = getattr(norm_module, "variance_epsilon", None) or getattr(norm_module, "eps", 1e-5)
    assert ours.norm_q is not None and ours.norm_kv is ours.norm_q
    assert_close(apply_norm(ours.norm_q, y, eps), y_out, f"layer {i} norm")


@pytest.mark.parametrize("name", sorted(CASES))
def test_split_projections_reproduce_model(name, tmp_path):
    case = CASES[name]
    model, path = build(case, tmp_path)
    layers = load_layers(path)
    assert [(a.block, a.layer) for a in layers] == [("decoder", i) for i in range(L)]
    for key, want in case.expect.items():
        assert getattr(layers[0].spec, key) == want, key
    blocks = get_attr(model, case.layers)
    mods = [watched(case, b) for b in blocks]
    ids = torch.randint(0, V, (2, 7), generator=torch.Generator().manual_seed(1))
    with capture(*(m for ms in mods for m in ms)) as rec, torch.no_grad():
        model(ids)
    n = len(mods[0])
    for i, ours in enumerate(layers):
        check_layer(ours, rec[i * n:(i + 1) * n], getattr(blocks[i], case.norm) if case.norm else None)


def test_model_type_recorded(tmp_path):
    _, path = build(CASES["llama"], tmp_path)
    with open_model(path) as m:
        assert m.info.model_type == "llama"
        assert m.info.blocks[0].flags() == ["gqa"]
