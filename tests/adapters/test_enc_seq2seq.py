"""Encoder-decoder families (T5, mT5, UMT5, BART, Marian, Whisper): encoder self-attention, decoder self-attention
and cross-attention come out as three blocks, each reproducing the model's own projections in a real forward pass;
cross-attention keys and values read the encoder output."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import transformers as tf

from tests.adapters.harness import Sites, assert_probs, check_layers, load_layers, randomise_, save_tiny

IDS = dict(pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
T5_SMALL = dict(d_model=64, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=3, num_heads=4, vocab_size=99, **IDS)
BART_SMALL = dict(d_model=64, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4, decoder_attention_heads=8,
                  encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=99, bos_token_id=2, **IDS)


def ids(seed: int, n: int):
    return torch.randint(3, 99, (2, n), generator=torch.Generator().manual_seed(seed))


def text2text(model, **kw):
    return model(input_ids=ids(1, 7), decoder_input_ids=ids(2, 5), **kw)


def audio2text(model, **kw):
    feats = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(3))  # (B, mel bins, 2 * source positions)
    return model(input_features=feats, decoder_input_ids=ids(2, 5), **kw)


def t5_sites(m, block, i):
    stack = m.encoder if block == "encoder" else m.decoder
    a = stack.block[i].layer[1].EncDecAttention if block == "cross" else stack.block[i].layer[0].SelfAttention
    return Sites(a.q, a.k, a.v, a.o)


def bart_sites(m, block, i):
    m = getattr(m, "model", m)  # MarianMTModel wraps the encoder-decoder in .model
    stack = m.encoder if block == "encoder" else m.decoder
    a = stack.layers[i].encoder_attn if block == "cross" else stack.layers[i].self_attn
    return Sites(a.q_proj, a.k_proj, a.v_proj, a.out_proj)


@dataclass
class Case:
    build: Callable[[], torch.nn.Module]
    run: Callable
    sites: Callable
    blocks: dict[str, int]
    norm_none: tuple[tuple[str, int], ...] = ()
    relative: bool = False  # self-attention scores carry a relative position term


CASES = {
    "t5": Case(lambda: tf.T5Model(tf.T5Config(**T5_SMALL)), text2text, t5_sites,
               {"encoder": 2, "decoder": 3, "cross": 3}, relative=True),
    "mt5": Case(lambda: tf.MT5Model(tf.MT5Config(**T5_SMALL)), text2text, t5_sites,
                {"encoder": 2, "decoder": 3, "cross": 3}, relative=True),
    "umt5": Case(lambda: tf.UMT5Model(tf.UMT5Config(**T5_SMALL)), text2text, t5_sites,
                 {"encoder": 2, "decoder": 3, "cross": 3}, relative=True),
    "bart": Case(lambda: tf.BartModel(tf.BartConfig(**BART_SMALL)), text2text, bart_sites,
                 {"encoder": 2, "decoder": 3, "cross": 3}),
    # Saved from the generation class: names carry a "model." prefix.
    "marian": Case(lambda: tf.MarianMTModel(tf.MarianConfig(**BART_SMALL)), text2text, bart_sites,
                   {"encoder": 2, "decoder": 3, "cross": 3}, norm_none=(("encoder", 0), ("decoder", 0))),
    "whisper": Case(lambda: tf.WhisperModel(tf.WhisperConfig(**{**BART_SMALL, "bos_token_id": 1}, num_mel_bins=8,
                                                             max_source_positions=16, max_target_positions=16)),
                    audio2text, bart_sites, {"encoder": 2, "decoder": 3, "cross": 3}),
}


def build_and_load(case: Case, tmp_path):
    torch.manual_seed(0)
    model = randomise_(case.build())
    return model, load_layers(save_tiny(model, tmp_path / "m"))


def run_all(case: Case, model, layers, **kw):
    outs = []
    inputs = check_layers(model, lambda m: outs.append(case.run(m, **kw)), layers, lambda b, i: case.sites(model, b, i))
    return outs[0], inputs


def built_and_run(case: Case, tmp_path):
    """Build and load the case (each block with the expected number of layers) and run it once:
    (model, layers, output, captured inputs)."""
    model, layers = build_and_load(case, tmp_path)
    count: dict[str, int] = {}
    for lay in layers:
        count[lay.block] = count.get(lay.block, 0) + 1
    assert count == case.blocks
    out, inputs = run_all(case, model, layers)
    return model, layers, out, inputs


@pytest.mark.parametrize("name", sorted(CASES))
def test_reproduces_projections_in_three_blocks(name, tmp_path):
    case = CASES[name]
    model, layers, out, inputs = built_and_run(case, tmp_path)
    for lay in layers:
        expect_norm = (lay.block, lay.layer) not in case.norm_none
        assert (lay.norm_q is not None) == expect_norm, (lay.block, lay.layer)
        if lay.block == "cross":
            # Keys and values read the encoder's output, through the recorded norm (checked in check_layers).
            x_kv = inputs[("cross", lay.layer)]["x_kv"]
            assert torch.equal(x_kv, out.encoder_last_hidden_state)
            assert lay.norm_kv is not None and lay.norm_kv is not lay.norm_q
            assert lay.spec.d_model_kv == 64
        else:
            assert lay.norm_kv is lay.norm_q


@pytest.mark.parametrize("name", sorted(CASES))
def test_reproduces_attention_probabilities(name, tmp_path):
    """softmax(score_scale * q k^T) equals the model's eager probabilities wherever no relative term enters the
    scores: every block of BART, Marian and Whisper; T5's cross-attention (which pins T5's scale of 1.0)."""
    case = CASES[name]
    model, layers = build_and_load(case, tmp_path)
    model.set_attn_implementation("eager")
    out, inputs = run_all(case, model, layers, output_attentions=True)
    probs = {"encoder": out.encoder_attentions, "decoder": out.decoder_attentions, "cross": out.cross_attentions}
    checked = 0
    for lay in layers:
        if case.relative and lay.block != "cross":
            continue
        x = inputs[(lay.block, lay.layer)]
        assert_probs(lay, x["x_q"], x["x_kv"], probs[lay.block][lay.layer], causal=lay.block == "decoder",
                     what=f"{name} {lay.block} layer {lay.layer}")
        checked += 1
    assert checked >= 3


def test_t5_flags(tmp_path):
    _, layers = build_and_load(CASES["t5"], tmp_path)
    by_block = {lay.block: lay.spec for lay in layers}
    assert {b: s.score_scale for b, s in by_block.items()} == {"encoder": 1.0, "decoder": 1.0, "cross": 1.0}
    assert {b: s.positional for b, s in by_block.items()} == {"encoder": "relative", "decoder": "relative",
                                                               "cross": "none"}
    assert by_block["encoder"].d_head == 8  # d_kv, not d_model / n_heads
    assert all(lay.norm_q.kind == "rmsnorm" and lay.norm_q.bias is None for lay in layers)
    assert all(lay.b_Q is None and lay.b_O is None for lay in layers)


def test_bart_scale_and_heads(tmp_path):
    _, layers = build_and_load(CASES["bart"], tmp_path)
    spec = {lay.block: lay.spec for lay in layers}
    assert (spec["encoder"].n_heads, spec["decoder"].n_heads, spec["cross"].n_heads) == (4, 8, 8)
    assert spec["encoder"].score_scale == 16**-0.5 and spec["cross"].score_scale == 8**-0.5


def test_whisper_keys_have_no_bias(tmp_path):
    _, layers = build_and_load(CASES["whisper"], tmp_path)
    assert all(lay.b_K is None and lay.b_Q is not None and lay.b_V is not None for lay in layers)


def test_t5_encoder_only_checkpoint(tmp_path):
    model = randomise_(tf.T5EncoderModel(tf.T5Config(**T5_SMALL)))
    layers = load_layers(save_tiny(model, tmp_path / "m"))
    assert {lay.block for lay in layers} == {"encoder"} and len(layers) == 2
    a = model.encoder.block
    check_layers(model, lambda m: m(input_ids=ids(1, 7)), layers,
                 lambda b, i: Sites(*(getattr(a[i].layer[0].SelfAttention, n) for n in "qkvo")))


def test_whisper_audio_classifier_is_encoder_only(tmp_path):
    cfg = tf.WhisperConfig(**{**BART_SMALL, "bos_token_id": 1}, num_mel_bins=8, max_source_positions=16)
    model = randomise_(tf.WhisperForAudioClassification(cfg))
    layers = load_layers(save_tiny(model, tmp_path / "m"))
    assert [(lay.block, lay.layer) for lay in layers] == [("encoder", 0), ("encoder", 1)]
    feats = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(3))
    check_layers(model, lambda m: m(input_features=feats), layers, lambda b, i: bart_sites(model, b, i))
