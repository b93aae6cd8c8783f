"""Reformer: LSH layers share one query_key matrix (W_K is W_Q), local layers have their own; per-layer flags."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from qkinspect.loading import open_model
from tests.adapters.harness import Sites, check_layers, load_layers, randomise_, save_tiny

KINDS = ["local", "lsh", "local"]


def build() -> torch.nn.Module:
    cfg = tf.ReformerConfig(
        hidden_size=64, num_attention_heads=4, attention_head_size=8, feed_forward_size=64, vocab_size=99,
        attn_layers=KINDS, axial_pos_shape=[4, 4], axial_pos_embds_dim=[32, 32], max_position_embeddings=16,
        local_attn_chunk_length=4, lsh_attn_chunk_length=4, num_buckets=2, num_hashes=1, hash_seed=0,
        is_decoder=False, pad_token_id=0, eos_token_id=2)
    torch.manual_seed(0)
    return randomise_(tf.ReformerModel(cfg))


def run(model, **kw):
    return model(input_ids=torch.randint(3, 99, (2, 16), generator=torch.Generator().manual_seed(1)), **kw)


def sites(model, block, i):
    att = model.encoder.layers[i].attention
    a = att.self_attention
    if hasattr(a, "query_key"):  # LSH: one projection gives both queries and (before normalising) keys
        return Sites(a.query_key, a.query_key, a.value, att.output.dense)
    return Sites(a.query, a.key, a.value, att.output.dense)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    model = build()
    path = save_tiny(model, tmp_path_factory.mktemp("reformer") / "m")
    return model, path, load_layers(path)


def test_reproduces_projections(loaded):
    model, _, layers = loaded
    assert [lay.layer for lay in layers] == [0, 1, 2]
    check_layers(model, run, layers, lambda b, i: sites(model, b, i))
    assert all(lay.norm_q is not None and lay.norm_q.kind == "layernorm" for lay in layers)


def test_lsh_layers_share_query_and_key(loaded):
    _, _, layers = loaded
    for lay, kind in zip(layers, KINDS, strict=True):
        assert lay.spec.attention_kind == kind
        assert lay.spec.shared_qk == (kind == "lsh")
        assert torch.equal(lay.W_K, lay.W_Q) == (kind == "lsh")
        assert lay.extra.get("key_normalised", False) == (kind == "lsh")
        assert (lay.spec.d_head, lay.spec.d_model) == (8, 64)  # attention_head_size need not be d_model / n_heads
        assert lay.b_Q is None and lay.b_O is None


def test_block_summary_says_mixed(loaded):
    _, path, _ = loaded
    with open_model(path) as m:
        (block,) = m.info.blocks
    assert block.attention_kind == "local+lsh" and not block.shared_qk
    assert "local+lsh" in block.flags()
