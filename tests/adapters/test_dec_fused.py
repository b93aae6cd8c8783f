"""Decoder-only families with a fused q/k/v projection (GPT-2, GPT-NeoX, BLOOM, Falcon in its three layouts,
MPT, Phi-3): the canonical matrices reproduce the query, key and value states the model itself splits out of
its fused projection (captured in a real forward pass, before any rotary embedding), the output projection,
and the norm feeding attention. Each split below is the model's own code (its method where it has one)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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

D, L, H, V, T = 64, 2, 4, 99, 7
d = D // H

Split = Callable[[torch.nn.Module, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


@dataclass
class Case:
    config: tf.PretrainedConfig
    layers: str  # base model attribute holding the decoder layers
    attn: str  # decoder layer attribute: attention module
    fused: str  # attention attribute: fused q/k/v projection
    out: str  # attention attribute: output projection
    norm: str  # decoder layer attribute: norm feeding attention
    split: Split  # (attention module, fused output (B, T, rows)) -> q, k, v each (B, T, n, d), as the model splits
    expect: dict


def gpt2_split(attn, y):
    q, k, v = y.split(attn.split_size, dim=2)  # GPT2Attention.forward
    return (t.view(*t.shape[:-1], -1, attn.head_dim) for t in (q, k, v))  # (B, T, n*d) -> (B, T, n, d)


def neox_split(attn, y):
    qkv = y.view(*y.shape[:-1], -1, 3 * attn.head_size)  # GPTNeoXAttention.forward: (B, T, H, 3d)
    return qkv.chunk(3, dim=-1)


def bloom_split(attn, y):
    # BloomAttention: per head, its query, key and value rows side by side: (B, T, H*3*d) -> (B, T, H, 3, d)
    qkv = y.view(*y.shape[:-1], attn.num_heads, 3, attn.head_dim)
    return qkv.unbind(-2)


def falcon_split(attn, y):
    """FalconAttention's three fused layouts, as its forward splits them; (B, T, n, d) each."""
    H, d = attn.num_heads, attn.head_dim
    if attn.new_decoder_architecture:  # per KV group: its query heads, then its key, then its value
        qkv = y.view(*y.shape[:-1], -1, H // attn.num_kv_heads + 2, d)  # (B, T, G, H/G + 2, d)
        q, k, v = qkv[..., :-2, :], qkv[..., -2:-1, :], qkv[..., -1:, :]
        k, v = k.expand(q.shape), v.expand(q.shape)  # keys/values broadcast to every query head of the group
        return (t.flatten(2, 3) for t in (q, k, v))  # (B, T, G, H/G, d) -> (B, T, H, d)
    if attn.multi_query:  # every query head, then the one key and the one value
        qkv = y.view(*y.shape[:-1], H + 2, d)  # (B, T, H + 2, d)
        return qkv[..., :-2, :], qkv[..., -2:-1, :], qkv[..., -1:, :]
    qkv = y.view(*y.shape[:-1], H, 3, d)  # per head, like BLOOM: (B, T, H, 3, d)
    return qkv.unbind(-2)


def mpt_split(attn, y):
    return (t.reshape(*t.shape[:2], attn.n_heads, attn.head_dim) for t in y.chunk(3, dim=2))  # MptAttention


def phi3_split(attn, y):
    c, hd = attn.config, attn.head_dim  # Phi3Attention.forward slices q, then k, then v
    qp, kvp = c.num_attention_heads * hd, attn.num_key_value_heads * hd
    q, k, v = y[..., :qp], y[..., qp:qp + kvp], y[..., qp + kvp:]
    return (t.view(*t.shape[:-1], -1, hd) for t in (q, k, v))


def falcon(**kw):
    base = dict(hidden_size=D, num_hidden_layers=L, num_attention_heads=H, vocab_size=V, bias=True)
    return tf.FalconConfig(**{**base, **kw})


FALCON = dict(layers="h", attn="self_attention", fused="query_key_value", out="dense", split=falcon_split)

CASES = {
    "gpt2": Case(tf.GPT2Config(n_embd=D, n_layer=L, n_head=H, vocab_size=V, n_positions=32), "h", "attn", "c_attn",
                 "c_proj", "ln_1", gpt2_split, dict(positional="absolute", n_kv_heads=H)),
    "gpt_neox": Case(tf.GPTNeoXConfig(hidden_size=D, num_hidden_layers=L, num_attention_heads=H, vocab_size=V,
                                      intermediate_size=64, rotary_pct=0.5), "layers", "attention",
                     "query_key_value", "dense", "input_layernorm", neox_split, dict(rotary_dims=d // 2)),
    "bloom": Case(tf.BloomConfig(hidden_size=D, n_layer=L, n_head=H, vocab_size=V), "h", "self_attention",
                  "query_key_value", "dense", "input_layernorm", bloom_split, dict(positional="alibi")),
    "falcon-gqa": Case(falcon(new_decoder_architecture=True, num_kv_heads=2), norm="ln_attn", **FALCON,
                       expect=dict(n_kv_heads=2, positional="rope")),
    "falcon-mqa": Case(falcon(multi_query=True, parallel_attn=True), norm="input_layernorm", **FALCON,
                       expect=dict(n_kv_heads=1)),
    "falcon-mha-alibi": Case(falcon(multi_query=False, alibi=True, parallel_attn=False), norm="input_layernorm",
                             **FALCON, expect=dict(n_kv_heads=H, positional="alibi")),
    "mpt": Case(tf.MptConfig(d_model=D, n_heads=H, n_layers=L, expansion_ratio=1, max_seq_len=32, vocab_size=V),
                "blocks", "attn", "Wqkv", "out_proj", "norm_1", mpt_split, dict(positional="alibi")),
    "phi3": Case(tf.Phi3Config(hidden_size=D, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=2,
                               intermediate_size=64, vocab_size=V, pad_token_id=0), "layers", "self_attn",
                 "qkv_proj", "o_proj", "input_layernorm", phi3_split, dict(n_kv_heads=2, positional="rope")),
}


def build(case: Case, tmp_path):
    torch.manual_seed(0)
    model = randomize(tf.AutoModel.from_config(case.config, attn_implementation="eager"))
    return model, save_tiny(model, tmp_path / "m")


def expand_kv(y: torch.Tensor, kv_index: torch.Tensor, n_model: int) -> torch.Tensor:
    """Our per-KV-head states (B, T, G, d) laid out as the model holds them: (B, T, G, d) or, where the
    model broadcasts keys/values to every query head (Falcon's new architecture), (B, T, H, d)."""
    return y if y.shape[2] == n_model else y[:, :, kv_index]  # (B, T, G, d) -> (B, T, H, d)


def check_layer(case: Case, model, ours, block) -> None:
    attn = getattr(block, case.attn)
    mods = (getattr(attn, case.fused), getattr(attn, case.out), getattr(block, case.norm))
    ids = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(1))
    with capture(*mods) as rec, torch.no_grad():
        model(ids)
    ((x,), _, fused), ((z,), _, o), ((y,), _, y_out) = (r[0] for r in rec)
    q, k, v = case.split(attn, fused)
    i = ours.layer
    assert_heads(x, ours.W_Q, ours.b_Q, q, f"layer {i} Q")
    kv = ours.kv_index()
    for W, b, want, what in ((ours.W_K, ours.b_K, k, "K"), (ours.W_V, ours.b_V, v, "V")):
        got = torch.einsum("btm,nmd->btnd", x.double(), W.double()) + (0 if b is None else b.double())
        assert_close(expand_kv(got, kv, want.shape[2]), want, f"layer {i} {what}")
    assert_close(output_proj(split_heads(z, H, d), ours.W_O, ours.b_O), o, f"layer {i} O")
    eps = getattr(mods[2], "eps", 1e-5)
    assert_close(apply_norm(ours.norm_q, y, eps), y_out, f"layer {i} norm")


@pytest.mark.parametrize("name", sorted(CASES))
def test_fused_projections_reproduce_model(name, tmp_path):
    case = CASES[name]
    model, path = build(case, tmp_path)
    layers = load_layers(path)
    assert len(layers) == L
    with open_model(path) as m:
        block = m.info.blocks[0]
    for key, want in case.expect.items():
        assert getattr(block, key) == want, key
    blocks = getattr(model, case.layers)
    for ours in layers:
        check_layer(case, model, ours, blocks[ours.layer])
