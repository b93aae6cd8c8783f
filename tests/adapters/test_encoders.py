"""Encoder families: a tiny random model of each, saved and loaded back through qkinspect, must reproduce the
model's own query, key and value states (and its output projection) captured in a real forward pass."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import transformers as tf

from tests.adapters.harness import Sites, assert_probs, check_layers, load_layers, randomise_, save_tiny

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=99)


def text_ids():
    return torch.randint(3, 99, (2, 7), generator=torch.Generator().manual_seed(1))


def image():
    return torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))


def text(model: torch.nn.Module, **kw):
    return model(input_ids=text_ids(), **kw)


def pixels(model: torch.nn.Module, **kw):
    return model(pixel_values=image(), **kw)


def both(model: torch.nn.Module, **kw):
    return model(input_ids=text_ids(), pixel_values=image(), **kw)


def encoder_attentions(out) -> dict:
    return {"encoder": out.attentions}


def bert_sites(m, block, i):
    a = m.encoder.layer[i].attention
    return Sites(a.self.query, a.self.key, a.self.value, a.output.dense)


def albert_sites(m, block, i):
    a = m.encoder.albert_layer_groups[0].albert_layers[0].attention
    return Sites(a.query, a.key, a.value, a.dense)


def distilbert_sites(m, block, i):
    a = m.transformer.layer[i].attention
    return Sites(a.q_lin, a.k_lin, a.v_lin, a.out_lin)


def deberta_sites(m, block, i):
    a = m.encoder.layer[i].attention
    return Sites(a.self.query_proj, a.self.key_proj, a.self.value_proj, a.output.dense)


def mpnet_sites(m, block, i):
    a = m.encoder.layer[i].attention.attn
    return Sites(a.q, a.k, a.v, a.o)


def vit_sites(m, block, i):
    # transformers 5 renamed the modules (checkpoints keep the old names): find them by what they are.
    a = m.layers[i].attention if hasattr(m, "layers") else m.encoder.layer[i].attention
    if hasattr(a, "q_proj"):
        return Sites(a.q_proj, a.k_proj, a.v_proj, a.o_proj)
    return Sites(a.attention.query, a.attention.key, a.attention.value, a.output.dense)


def clip_sites(m, block, i):
    # CLIPModel holds both towers; CLIPTextModel / CLIPVisionModel are the tower itself (transformers 5).
    tower = getattr(m, f"{block}_model", m)
    a = tower.encoder.layers[i].self_attn
    return Sites(a.q_proj, a.k_proj, a.v_proj, a.out_proj)


@dataclass
class Case:
    build: Callable[[], torch.nn.Module]
    run: Callable[[torch.nn.Module], object]
    sites: Callable
    blocks: dict[str, int]  # block key -> layers
    norm_none: tuple[tuple[str, int], ...] = ()  # layers with no norm directly before them
    # The model's own attention probabilities per block, where scores are q·k alone (no relative term).
    attentions: Callable[[object], dict] | None = encoder_attentions
    causal: tuple[str, ...] = ()  # blocks with a causal mask


def _bert_like(config_cls, model_cls, **kw):
    return Case(lambda: model_cls(config_cls(**SMALL, **kw)), text, bert_sites, {"encoder": 2})


CASES = {
    "bert": _bert_like(tf.BertConfig, tf.BertModel),
    "roberta": _bert_like(tf.RobertaConfig, tf.RobertaModel, pad_token_id=1),
    "xlm-roberta": _bert_like(tf.XLMRobertaConfig, tf.XLMRobertaModel, pad_token_id=1),
    "camembert": _bert_like(tf.CamembertConfig, tf.CamembertModel, pad_token_id=1),
    # ELECTRA's embeddings are narrower than its hidden size and projected: layer 0 has no norm right before it.
    "electra": Case(lambda: tf.ElectraModel(tf.ElectraConfig(**SMALL, embedding_size=32)), text, bert_sites,
                    {"encoder": 2}, norm_none=(("encoder", 0),)),
    "distilbert": Case(lambda: tf.DistilBertModel(tf.DistilBertConfig(dim=64, n_layers=2, n_heads=4, hidden_dim=64,
                                                                      vocab_size=99, pad_token_id=0)),
                       text, distilbert_sites, {"encoder": 2}),
    "albert": Case(lambda: tf.AlbertModel(tf.AlbertConfig(**{**SMALL, "num_hidden_layers": 3}, embedding_size=32)),
                   text, albert_sites, {"encoder": 3}, norm_none=(("encoder", 0),)),
    # DeBERTa-v3's layout: relative attention (c2p and p2c terms), shared position keys, a convolution after layer 0.
    "deberta-v2": Case(lambda: tf.DebertaV2Model(tf.DebertaV2Config(
        **SMALL, relative_attention=True, pos_att_type=["p2c", "c2p"], position_biased_input=False,
        position_buckets=8, max_relative_positions=16, norm_rel_ebd="layer_norm", share_att_key=True,
        conv_kernel_size=3)), text, deberta_sites, {"encoder": 2}, attentions=None),
    "deberta-v2-plain": Case(lambda: tf.DebertaV2Model(tf.DebertaV2Config(**SMALL)), text, deberta_sites,
                             {"encoder": 2}),
    # pos_att_type without relative terms: scores are q·k alone, still divided by sqrt(3 d_head).
    "deberta-v2-scaled": Case(lambda: tf.DebertaV2Model(tf.DebertaV2Config(**SMALL, pos_att_type=["p2c", "c2p"])),
                              text, deberta_sites, {"encoder": 2}),
    "mpnet": Case(lambda: tf.MPNetModel(tf.MPNetConfig(**SMALL)), text, mpnet_sites, {"encoder": 2},
                  attentions=None),
    "vit": Case(lambda: tf.ViTModel(tf.ViTConfig(**SMALL, image_size=16, patch_size=8)), pixels, vit_sites,
                {"encoder": 2}),
    "deit": Case(lambda: tf.DeiTModel(tf.DeiTConfig(**SMALL, image_size=16, patch_size=8)), pixels, vit_sites,
                 {"encoder": 2}),
    "clip": Case(lambda: tf.CLIPModel(tf.CLIPConfig(
        text_config=dict(**SMALL, bos_token_id=0, eos_token_id=2, pad_token_id=1),
        vision_config=dict(**{**SMALL, "hidden_size": 48, "num_hidden_layers": 3}, image_size=16, patch_size=8))),
        both, clip_sites, {"text": 2, "vision": 3}, causal=("text",),
        attentions=lambda o: {"text": o.text_model_output.attentions, "vision": o.vision_model_output.attentions}),
    "clip_text_model": Case(lambda: tf.CLIPTextModel(tf.CLIPTextConfig(**SMALL, bos_token_id=0, eos_token_id=2,
                                                                       pad_token_id=1)),
                            text, clip_sites, {"text": 2}, causal=("text",),
                            attentions=lambda o: {"text": o.attentions}),
    "clip_vision_model": Case(lambda: tf.CLIPVisionModel(tf.CLIPVisionConfig(**SMALL, image_size=16, patch_size=8)),
                              pixels, clip_sites, {"vision": 2}, attentions=lambda o: {"vision": o.attentions}),
}


def build_and_load(case: Case, tmp_path):
    torch.manual_seed(0)
    model = randomise_(case.build())
    return model, load_layers(save_tiny(model, tmp_path / "m"))


@pytest.mark.parametrize("name", sorted(CASES))
def test_reproduces_projections(name, tmp_path):
    case = CASES[name]
    model, layers = build_and_load(case, tmp_path)
    got = {}
    for lay in layers:
        got[lay.block] = got.get(lay.block, 0) + 1
    assert got == case.blocks
    check_layers(model, case.run, layers, lambda b, i: case.sites(model, b, i))
    for lay in layers:
        expect_norm = (lay.block, lay.layer) not in case.norm_none
        assert (lay.norm_q is not None) == expect_norm, (lay.block, lay.layer)
        assert lay.norm_kv is lay.norm_q  # self-attention: keys read the same stream
        assert lay.W_O is not None and lay.b_Q is not None


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c.attentions is not None))
def test_reproduces_attention_probabilities(name, tmp_path):
    """softmax(score_scale * q k^T) from qkinspect's matrices equals the model's own (eager) probabilities:
    this pins the recorded scale as well as the matrices."""
    case = CASES[name]
    model, layers = build_and_load(case, tmp_path)
    model.set_attn_implementation("eager")
    outs = []
    inputs = check_layers(model, lambda m: outs.append(case.run(m, output_attentions=True)), layers,
                          lambda b, i: case.sites(model, b, i))
    probs = case.attentions(outs[0])
    for lay in layers:
        x = inputs[(lay.block, lay.layer)]
        assert_probs(lay, x["x_q"], x["x_kv"], probs[lay.block][lay.layer], lay.block in case.causal,
                     f"{name} {lay.block} layer {lay.layer}")


def test_albert_shares_one_set_of_weights(tmp_path):
    _, layers = build_and_load(CASES["albert"], tmp_path)
    assert [lay.source_layer for lay in layers] == [0, 0, 0]
    assert all(lay.spec.shared_layers and "shared_layers" in lay.spec.flags() for lay in layers)
    assert all(torch.equal(lay.W_Q, layers[0].W_Q) for lay in layers)
    assert layers[0].spec.d_model == 64  # the hidden size, not the embedding size (32)
    # Layers after the first read the shared layer's full_layer_layer_norm; they share it too.
    assert torch.equal(layers[1].norm_q.weight, layers[2].norm_q.weight)


def test_albert_groups_map_layers_to_their_weights(tmp_path):
    cfg = tf.AlbertConfig(**{**SMALL, "num_hidden_layers": 4}, embedding_size=32, num_hidden_groups=2,
                          inner_group_num=2)
    model = randomise_(tf.AlbertModel(cfg))
    layers = load_layers(save_tiny(model, tmp_path / "m"))
    # 4 applications of a group of 2 layers; groups 0, 0, 1, 1 -> weights (0,0),(0,1),(0,0),(0,1),(1,0),(1,1),...
    assert len(layers) == 8
    assert [lay.source_layer for lay in layers] == [0, 1, 0, 1, 4, 5, 4, 5]
    groups = model.encoder.albert_layer_groups

    def sites(block, j):
        outer, inner = divmod(j, 2)
        a = groups[outer // 2].albert_layers[inner].attention
        return Sites(a.query, a.key, a.value, a.dense)

    check_layers(model, text, layers, sites)


def test_deberta_records_its_scale(tmp_path):
    _, layers = build_and_load(CASES["deberta-v2"], tmp_path)
    s = layers[0].spec
    assert s.positional == "relative"
    assert math.isclose(s.score_scale, (16 * 3) ** -0.5)  # sqrt(d_head * (1 + |{c2p, p2c}|))
    _, scaled = build_and_load(CASES["deberta-v2-scaled"], tmp_path / "scaled")
    assert scaled[0].spec.positional == "absolute" and math.isclose(scaled[0].spec.score_scale, (16 * 3) ** -0.5)
    _, plain = build_and_load(CASES["deberta-v2-plain"], tmp_path / "plain")
    assert plain[0].spec.positional == "absolute" and math.isclose(plain[0].spec.score_scale, 16**-0.5)


def test_mpnet_is_relative(tmp_path):
    _, layers = build_and_load(CASES["mpnet"], tmp_path)
    assert layers[0].spec.positional == "relative"


def test_clip_towers_are_two_labelled_encoders(tmp_path):
    from qkinspect.loading import open_model

    model = randomise_(CASES["clip"].build())
    with open_model(save_tiny(model, tmp_path / "m")) as m:
        blocks = {b.key: b for b in m.info.blocks}
        assert set(blocks) == {"text", "vision"}
        assert {b.name for b in blocks.values()} == {"encoder"}
        assert (blocks["text"].d_model, blocks["vision"].d_model) == (64, 48)
        assert m.info.block("vision").n_layers == 3
        only_vision = list(m.layers(blocks=["vision"]))
    assert [lay.layer for lay in only_vision] == [0, 1, 2]
    assert {lay.W_Q.shape for lay in only_vision} == {(4, 48, 12)}
