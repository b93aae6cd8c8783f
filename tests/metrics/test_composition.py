"""Composition scores (qkinspect.composition) against a dense float64 reference read straight from transformers
modules, on tiny models of every family class: MHA (BERT, GPT-2), GQA (Llama, Qwen2), fused QKV (GPT-NeoX, Phi-3)
and encoder-decoder (T5, BART); grouped-query pairing against an expanded-MHA copy; the streaming in chunks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as tf

import qkinspect
from qkinspect.composition import run as composing
from tests.metrics import composition_reference as ref

# float32 products of float64-reduced factors: each score within a few eps(float32) * √d_head of the reference;
# 1e-5 leaves a factor of 10 or more on these shapes (d_head <= 16)
RTOL32 = 1e-5
RTOL64 = 1e-10


def _randomised(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Weights and norm gains away from their initial values (gains of 1 would hide an unfolded norm)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() and name.endswith("weight"):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model.eval()


def check_decoder(result, layers: list[list[ref.Head]], rtol: float) -> None:
    """Every (earlier layer, later layer, kind) of a one-block model against the dense reference."""
    L = len(layers)
    seen = 0
    for i in range(L):
        for j in range(i + 1, L):
            want = ref.pair_scores(layers[i], layers[j])
            for kind, w in want.items():
                got = result.scores[(result.model.blocks[0].key, i, result.model.blocks[0].key, j, kind)]
                np.testing.assert_allclose(got, w, rtol=rtol, err_msg=f"{i}->{j} {kind}")
                seen += 1
    assert seen == 3 * L * (L - 1) // 2 and len(result.scores) == seen


def llama_model(G: int = 2, H: int = 4, L: int = 3, cls=tf.LlamaConfig, model=tf.LlamaModel, **kw):
    cfg = cls(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=L, num_attention_heads=H,
              num_key_value_heads=G, head_dim=8, max_position_embeddings=16, **kw)
    return _randomised(model(cfg))


@pytest.mark.parametrize("precision,rtol", [("float32", RTOL32), ("float64", RTOL64)])
@pytest.mark.parametrize("fold", [True, False])
def test_llama_gqa_against_the_dense_reference(precision, rtol, fold):
    m = llama_model()
    got = qkinspect.composition(m, fold_ln=fold, precision=precision)
    check_decoder(got, [ref.llama_like(layer, 4, 2, fold) for layer in m.layers], rtol)
    assert got.processing.fold_ln is fold and got.processing.rotary == ("decoder",)


def test_qwen2_gqa_with_biases():
    m = llama_model(cls=tf.Qwen2Config, model=tf.Qwen2Model)
    check_decoder(qkinspect.composition(m), [ref.llama_like(layer, 4, 2, True) for layer in m.layers], RTOL32)


def test_gpt2_conv1d():
    m = _randomised(tf.GPT2Model(tf.GPT2Config(n_embd=24, n_layer=3, n_head=4, n_positions=16, vocab_size=40)))
    check_decoder(qkinspect.composition(m), [ref.gpt2(block, 4, True) for block in m.h], RTOL32)


def test_bert_raw():
    m = _randomised(tf.BertModel(tf.BertConfig(hidden_size=24, num_hidden_layers=3, num_attention_heads=4,
                                               intermediate_size=30, vocab_size=40, max_position_embeddings=16)))
    check_decoder(qkinspect.composition(m, fold_ln=False), [ref.bert(layer, 4) for layer in m.encoder.layer],
                  RTOL32)


def test_gpt_neox_fused_interleaved():
    cfg = tf.GPTNeoXConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=40,
                           vocab_size=40, max_position_embeddings=16)
    m = _randomised(tf.GPTNeoXModel(cfg))
    check_decoder(qkinspect.composition(m), [ref.gpt_neox(layer, 4, True) for layer in m.layers], RTOL32)


def test_phi3_fused_sectioned_gqa():
    cfg = tf.Phi3Config(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=40, vocab_size=40, max_position_embeddings=16, pad_token_id=0)
    m = _randomised(tf.Phi3Model(cfg))
    check_decoder(qkinspect.composition(m), [ref.phi3(layer, 4, 2, True) for layer in m.layers], RTOL32)


def seq2seq_reference(enc: list, dec: list, cross: list) -> dict:
    """Every pair an encoder-decoder has, by the rules written out: encoder i -> encoder j > i (q, k, v) and ->
    every cross j (k, v); decoder i -> decoder j > i (q, k, v) and -> cross j >= i (q); cross i -> decoder j > i
    (q, k, v) and -> cross j > i (q)."""
    out = {}
    stacks = {"encoder": enc, "decoder": dec, "cross": cross}
    rules = [("encoder", "encoder", lambda i, j: j > i, "qkv"), ("encoder", "cross", lambda i, j: True, "kv"),
             ("decoder", "decoder", lambda i, j: j > i, "qkv"), ("decoder", "cross", lambda i, j: j >= i, "q"),
             ("cross", "decoder", lambda i, j: j > i, "qkv"), ("cross", "cross", lambda i, j: j > i, "q")]
    for fa, fb, when, kinds in rules:
        for i, a in enumerate(stacks[fa]):
            for j, b in enumerate(stacks[fb]):
                if when(i, j):
                    for kind, s in ref.pair_scores(a, b, tuple(kinds)).items():
                        out[(fa, i, fb, j, kind)] = s
    return out


def check_seq2seq(result, want: dict) -> None:
    assert set(result.scores) == set(want)
    for key, w in want.items():
        np.testing.assert_allclose(result.scores[key], w, rtol=RTOL32, err_msg=str(key))


def test_bart_encoder_decoder_pairs():
    cfg = tf.BartConfig(vocab_size=40, d_model=24, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
                        decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=16)
    m = _randomised(tf.BartModel(cfg))
    got = qkinspect.composition(m, fold_ln=False)
    check_seq2seq(got, seq2seq_reference([ref.attention(layer.self_attn, 4) for layer in m.encoder.layers],
                                         [ref.attention(layer.self_attn, 4) for layer in m.decoder.layers],
                                         [ref.attention(layer.encoder_attn, 4) for layer in m.decoder.layers]))
    pairs = {(p.from_block, p.to_block): p.kinds for p in got.pairs}
    assert pairs == {("encoder", "encoder"): ("q", "k", "v"), ("encoder", "cross"): ("k", "v"),
                     ("decoder", "decoder"): ("q", "k", "v"), ("decoder", "cross"): ("q",),
                     ("cross", "decoder"): ("q", "k", "v"), ("cross", "cross"): ("q",)}
    assert {"from_block", "to_block"} <= set(next(got.rows()))


def test_t5_encoder_decoder_pairs():
    cfg = tf.T5Config(vocab_size=40, d_model=24, d_kv=6, d_ff=32, num_layers=2, num_decoder_layers=2, num_heads=4,
                      relative_attention_num_buckets=8)
    m = _randomised(tf.T5Model(cfg))
    names = ("q", "k", "v", "o")
    got = qkinspect.composition(m, fold_ln=False)
    check_seq2seq(got, seq2seq_reference([ref.attention(b.layer[0].SelfAttention, 4, names) for b in m.encoder.block],
                                         [ref.attention(b.layer[0].SelfAttention, 4, names) for b in m.decoder.block],
                                         [ref.attention(b.layer[1].EncDecAttention, 4, names)
                                          for b in m.decoder.block]))


def _copy_attention(src, dst, expand) -> None:
    """dst's attention and input norm from src's, each key/value head expanded to four by `expand`."""
    with torch.no_grad():
        for a, b in zip(src.layers, dst.layers, strict=True):
            for name in ("k_proj", "v_proj"):
                w = getattr(a.self_attn, name).weight.view(2, 8, 32)  # (G, d, D)
                getattr(b.self_attn, name).weight.copy_(expand(w).reshape(32, 32))
            for name in ("q_proj", "o_proj"):
                getattr(b.self_attn, name).weight.copy_(getattr(a.self_attn, name).weight)
            b.input_layernorm.weight.copy_(a.input_layernorm.weight)


def test_grouped_query_pairing_equals_the_expanded_model():
    """A GQA model and its MHA copy (each key/value head repeated for the query heads that read it, h // rep)
    give the same scores: the pairing is h // (H / G), never h % G."""
    gqa, mha, tiled = llama_model(G=2, H=4), llama_model(G=4, H=4), llama_model(G=4, H=4)
    _copy_attention(gqa, mha, lambda w: w.repeat_interleave(2, dim=0))  # heads 0, 1 read kv 0: h // 2
    _copy_attention(gqa, tiled, lambda w: w.repeat(2, 1, 1))  # the published mistake: kv h % 2
    a, b, c = (qkinspect.composition(x) for x in (gqa, mha, tiled))
    assert a.scores.keys() == b.scores.keys()
    for k in a.scores:
        np.testing.assert_allclose(a.scores[k], b.scores[k], rtol=1e-6, err_msg=str(k))
    assert any(not np.allclose(a.scores[k], c.scores[k], rtol=1e-3) for k in a.scores)  # the test can fail


def test_streaming_in_chunks_gives_the_same_scores(monkeypatch):
    """Earlier layers held a few at a time (several reads of the model) and products cut small: same scores."""
    m = llama_model(L=5)
    whole = qkinspect.composition(m)
    monkeypatch.setattr(composing, "HELD_BYTES", 1)  # one earlier layer per chunk
    monkeypatch.setattr(composing, "OUT_BYTES", 1)  # one earlier layer per product
    cut = qkinspect.composition(m)
    assert list(cut.scores) == list(whole.scores)
    for k in whole.scores:
        np.testing.assert_allclose(cut.scores[k], whole.scores[k], rtol=1e-6)


def test_selection_and_records():
    m = llama_model(L=4)
    r = qkinspect.composition(m, kinds="k", from_layers=[0, 1], to_layers="2-3", to_heads=[1])
    assert {(k[1], k[3], k[4]) for k in r.scores} == {(0, 2, "k"), (0, 3, "k"), (1, 2, "k"), (1, 3, "k")}
    rows = list(r.rows())
    assert len(rows) == 4 * 4 * 1 and {x["to_head"] for x in rows} == {1}
    assert list(rows[0]) == ["from_layer", "from_head", "to_layer", "to_head", "kind", "score", "baseline", "ratio"]
    assert all(x["baseline"] == pytest.approx(32 ** -0.5) and x["ratio"] == pytest.approx(x["score"] * 32 ** 0.5)
               for x in rows)
    cols = r.columns()
    assert len(cols["score"]) == len(rows) and np.allclose(cols["score"], [x["score"] for x in rows])
    best = r.top("k", 3)
    assert [b.ratio for b in best] == sorted((x["ratio"] for x in rows), reverse=True)[:3]


def test_a_zero_head_is_nan_with_a_warning():
    m = llama_model()
    with torch.no_grad():
        m.layers[0].self_attn.o_proj.weight[:, :8].zero_()  # head 0 of layer 0 writes nothing
    r = qkinspect.composition(m)
    s = r.scores[("decoder", 0, "decoder", 1, "q")]
    assert np.isnan(s[0]).all() and np.isfinite(s[1:]).all()
    assert any("NaN" in w for w in r.warnings)


@pytest.mark.parametrize("kw,says", [
    ({"kinds": "x"}, "kinds=x"), ({"precision": "float16"}, "precision="), ({"to_layers": 9}, "to_layers=9"),
    ({"layers": "0"}, "no earlier head composes"), ({"blocks": "cross"}, "blocks=cross"),
    ({"device": "tpu"}, "device='tpu'"),
])
def test_bad_requests(kw, says):
    with pytest.raises(qkinspect.QkinspectError, match=says):
        qkinspect.composition(llama_model(), **kw)


def test_saved_document_reads_back(tmp_path):
    import json

    from qkinspect.composition.saved import read_composition

    m = llama_model()
    r = qkinspect.composition(m)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(r.document()))
    back = read_composition(path)
    assert back.scores.keys() == r.scores.keys()
    for k in r.scores:
        np.testing.assert_array_equal(back.scores[k], r.scores[k])
    doc = r.document()
    doc["records"][0]["from_head"] = -1
    path.write_text(json.dumps(doc))
    with pytest.raises(qkinspect.QkinspectError, match="not a valid composition document"):
        read_composition(path)


def test_the_fold_is_analyze_s_fold_and_mutates_nothing():
    """Gains folded inside the products give the scores of the layers `fold_ln` (analyze --fold-ln) returns, and
    the model's float64 weights are left as they were."""
    from qkinspect.loading import open_model
    from qkinspect.metrics.composition import read_side, scores, write_side
    from qkinspect.metrics.fold import fold_ln

    m = llama_model().double()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    got = qkinspect.composition(m, precision="float64")
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    with open_model(m) as opened:
        layers = [fold_ln(x) for x in opened.layers(dtype=torch.float64)]
    for i in range(3):
        for j in range(i + 1, 3):
            w, r = write_side(layers[i], torch.float64), read_side(layers[j], dtype=torch.float64)
            for kind in "qkv":
                np.testing.assert_allclose(got.scores[("decoder", i, "decoder", j, kind)],
                                           scores(w, r, kind).numpy(), rtol=1e-10)


def test_which_blocks_compose_in_two_towers_and_an_outside_encoder():
    """CLIP: each tower composes within itself only. GPT-2 with cross-attention: its keys and values read an encoder
    outside the checkpoint, so nothing composes into them; its queries read the decoder stream."""
    clip = tf.CLIPModel(tf.CLIPConfig(
        text_config={"hidden_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 32,
                     "vocab_size": 40, "max_position_embeddings": 16},
        vision_config={"hidden_size": 16, "num_hidden_layers": 3, "num_attention_heads": 2, "intermediate_size": 32,
                       "image_size": 8, "patch_size": 4}))
    r = qkinspect.composition(_randomised(clip))
    assert {(p.from_block, p.to_block, p.kinds, p.width) for p in r.pairs} == {
        ("text", "text", ("q", "k", "v"), 24), ("vision", "vision", ("q", "k", "v"), 16)}
    assert {k[0] for k in r.scores} == {"text", "vision"} and all(k[0] == k[2] for k in r.scores)
    assert r.baseline("vision", "vision") == pytest.approx(16 ** -0.5)
    gpt2 = tf.GPT2Model(tf.GPT2Config(n_embd=24, n_layer=2, n_head=4, n_positions=16, vocab_size=40,
                                      add_cross_attention=True))
    r = qkinspect.composition(_randomised(gpt2))
    assert {(p.from_block, p.to_block): p.kinds for p in r.pairs} == {
        ("decoder", "decoder"): ("q", "k", "v"), ("decoder", "cross"): ("q",), ("cross", "decoder"): ("q", "k", "v"),
        ("cross", "cross"): ("q",)}
    assert ("decoder", 0, "cross", 0, "q") in r.scores and ("cross", 0, "cross", 0, "q") not in r.scores
