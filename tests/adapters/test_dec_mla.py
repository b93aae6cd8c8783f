"""DeepSeek-V2/V3 Multi-head Latent Attention: the composed W_Q, W_K, W_V reproduce the model's own query, key and
value states captured in a real forward pass, up to the per-token latent scalars s_q = 1/rms(query latent) (whole
query head) and s_kv = 1/rms(c_kv) (content part of keys, and values), computed here from the inputs of the model's
own latent norms; W_O reproduces o_proj; --fold-ln folds input_layernorm; and the model's own attention
probabilities come back from the canonical matrices with the model's own rotary function (scale, YaRN factors,
rotary layout at the end of each head)."""

from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys

import pytest
import torch
import transformers as tf
from typer.testing import CliRunner

from qkinspect.cli.app import app
from qkinspect.layer import Norm
from qkinspect.loading import open_model
from qkinspect.metrics.fold import fold_ln
from tests.adapters.harness import (
    apply_norm,
    assert_close,
    assert_normalised,
    assert_out_proj,
    capture,
    load_layers,
    per_head,
    randomise_,
    record_input,
    record_output,
    save_tiny,
    split_heads,
)

D, L, H, V = 64, 3, 4, 99
DN, DR, DV, R, RQ = 8, 4, 6, 16, 24
MOE = dict(n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=16,
           first_k_dense_replace=1)
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=16, mscale=1.0,
            mscale_all_dim=0.5)


def mla(cls, **kw):
    base = dict(hidden_size=D, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=H,
                intermediate_size=64, vocab_size=V, q_lora_rank=RQ, kv_lora_rank=R, qk_nope_head_dim=DN,
                qk_rope_head_dim=DR, v_head_dim=DV, max_position_embeddings=64, **MOE)
    return cls(**{**base, **kw})


CONFIGS = {
    "v3": mla(tf.DeepseekV3Config, n_group=2, topk_group=1),
    "v3-half-bias": mla(tf.DeepseekV3Config, n_group=2, topk_group=1, rope_interleave=False, attention_bias=True),
    "v3-yarn": mla(tf.DeepseekV3Config, n_group=2, topk_group=1, rope_parameters=YARN),
    "v2": mla(tf.DeepseekV2Config),
    "v2-lite": mla(tf.DeepseekV2Config, q_lora_rank=None, attention_bias=True),
}
MODELS = {"deepseek_v3": tf.DeepseekV3ForCausalLM, "deepseek_v2": tf.DeepseekV2ForCausalLM}


def build(name: str, tmp_path):
    config = tf.AutoConfig.for_model(**CONFIGS[name].to_dict())  # a copy: the model must not change the shared one
    model = MODELS[config.model_type](config)
    model.set_attn_implementation("eager")  # attention probabilities are returned
    model = randomise_(model, seed=3)
    return model, save_tiny(model, tmp_path / name)


def rms_scalar(norm_module, y: torch.Tensor) -> torch.Tensor:
    """1/rms(y) as the model's RMSNorm module computes it (its own eps), (...,) -> (..., 1, 1) for heads."""
    return torch.rsqrt(y.double().pow(2).mean(-1) + norm_module.variance_epsilon)[..., None, None]


def states(ours, x: torch.Tensor, s_q: torch.Tensor, s_kv: torch.Tensor):
    """Queries, keys, values from the canonical matrices and the latent scalars: (B, T, H, d|dv) each, the scalar
    s_kv on the content (first DN) dims of the keys only."""
    def proj(W, b):
        return per_head(x.double(), W.double(), None if b is None else b.double())

    q = s_q * proj(ours.W_Q, ours.b_Q)
    k = proj(ours.W_K, ours.b_K)
    k = torch.cat([s_kv * k[..., :DN], k[..., DN:]], dim=-1)  # (B, T, H, DN) | (B, T, H, DR) -> (B, T, H, d)
    return q, k, s_kv * proj(ours.W_V, ours.b_V)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_mla_reproduces_the_model(name, tmp_path):
    model, path = build(name, tmp_path)
    layers = load_layers(path)
    assert [lay.layer for lay in layers] == list(range(L))  # dense and MoE layers alike
    a = float(model.model.rotary_emb.attention_scaling)  # YaRN's factor on cos and sin (1 otherwise)
    assert (a != 1.0) == (name == "v3-yarn")
    blocks = model.model.layers
    lora = CONFIGS[name].q_lora_rank is not None
    watched = []
    for blk in blocks:
        at = blk.self_attn
        q_mods = (at.q_a_layernorm, at.q_b_proj) if lora else (at.q_proj,)
        watched += [blk.input_layernorm, *q_mods, at.kv_a_proj_with_mqa, at.kv_a_layernorm, at.kv_b_proj, at.o_proj,
                    at]
    ids = torch.randint(0, V, (2, 7), generator=torch.Generator().manual_seed(1))
    with capture(*watched) as rec, torch.no_grad():
        out = model(ids, output_attentions=True)
    n = len(watched) // L
    for i, ours in enumerate(layers):
        check_layer(name, ours, rec[i * n:(i + 1) * n], blocks[i], lora, a, out.attentions[i])


def check_layer(name, ours, rec, blk, lora, a, probs):
    what = f"{name} layer {ours.layer}"
    at = blk.self_attn
    first = rec[0][0]
    y, x = record_input(first), record_output(first)  # residual stream, and the attention input
    if lora:
        c_q = record_input(rec[1][0])
        s_q, q = rms_scalar(at.q_a_layernorm, c_q), record_output(rec[2][0])
        rec = rec[3:]
    else:
        s_q, q = torch.ones(()).double(), record_output(rec[1][0])
        rec = rec[2:]
    kv_a, c_kv, kv_b, o, attn = (r[0] for r in rec)
    s_kv = rms_scalar(at.kv_a_layernorm, record_input(c_kv))
    k_pe = record_output(kv_a)[..., R:]  # (B, T, DR): one rotary key per token, shared by the heads
    q_want = split_heads(q, H, DN + DR)  # (B, T, H*d) -> (B, T, H, d)
    q_want = torch.cat([q_want[..., :DN], a * q_want[..., DN:]], dim=-1)
    kv_b_out = record_output(kv_b)[:, 0]  # the latent is viewed as one head: (B, 1, T, H*(DN+DV)) -> (B, T, ...)
    kv_want = split_heads(kv_b_out, H, DN + DV)  # (B, T, H*(DN+DV)) -> (B, T, H, DN+DV)
    k_want = torch.cat([kv_want[..., :DN], a * k_pe[:, :, None].expand(-1, -1, H, -1)], dim=-1)
    got_q, got_k, got_v = states(ours, x, s_q, s_kv)
    assert_close(got_q, q_want, f"{what} queries")
    assert_close(got_k, k_want, f"{what} keys")
    assert_close(got_v, kv_want[..., DN:], f"{what} values")
    assert_out_proj(record_input(o), ours.W_O, ours.b_O, record_output(o), what)
    assert_normalised(x, ours.norm_q, f"{what} attention input")
    assert torch.equal(record_input(kv_a), x) and torch.equal(record_input(attn), x), what
    check_fold(ours, y, x, blk.input_layernorm.variance_epsilon, what)
    check_probs(ours, name, got_q, got_k, attn[1]["position_embeddings"], a, probs, what)


def check_fold(ours, y, x, eps, what):
    """--fold-ln: the folded matrices on the gain-free normalised stream give what the stored ones give on x (the
    latent scalars are unchanged: they are computed after the projections)."""
    folded = fold_ln(ours)
    unit = apply_norm(Norm("rmsnorm", torch.ones_like(ours.norm_q.weight)), y, eps)
    for W, b in (("W_Q", "b_Q"), ("W_K", "b_K"), ("W_V", "b_V")):
        fb, ob = getattr(folded, b), getattr(ours, b)
        assert_close(per_head(unit, getattr(folded, W).double(), None if fb is None else fb.double()),
                     per_head(x.double(), getattr(ours, W).double(), None if ob is None else ob.double()),
                     f"{what} fold {W}")


def check_probs(ours, name, q, k, position_embeddings, a, probs, what):
    """softmax(scale * rot(q) . rot(k)), causal, from the canonical states, rotating the LAST DR dims of each head
    with the model's own function on unit cos/sin (the factor a is already in W's rotary columns)."""
    family = "deepseek_v3" if name.startswith("v3") else "deepseek_v2"
    mod = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, T, H, d) -> (B, H, T, d)
    if family == "deepseek_v2":
        q_pe, k_pe = mod.apply_rotary_emb(q[..., DN:], k[..., DN:], position_embeddings / a)
    else:
        cos, sin = (t.double() / a for t in position_embeddings)
        rotate = mod.apply_rotary_pos_emb_interleave if ours.extra["rotary_style"] == "interleaved" else \
            mod.apply_rotary_pos_emb
        q_pe, k_pe = rotate(q[..., DN:], k[..., DN:], cos, sin)
    q = torch.cat([q[..., :DN], q_pe.double()], -1)
    k = torch.cat([k[..., :DN], k_pe.double()], -1)
    scores = (q @ k.transpose(-1, -2)) * ours.spec.score_scale  # (B, H, T, T)
    T = scores.shape[-1]
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    assert_close(scores.softmax(-1), probs, f"{what} probabilities")


# -- spec, extras, refusals, CLI ----------------------------------------------------------------------------------


def test_spec_and_extras(tmp_path):
    model, path = build("v3-yarn", tmp_path)
    with open_model(path) as m:
        s = m.info.blocks[0]
        lay = next(m.layers())
    assert (s.n_heads, s.n_kv_heads, s.d_head, s.v_head, s.positional, s.rotary_dims) == (H, H, DN + DR, DV, "rope", DR)
    m_all = 0.1 * 0.5 * math.log(4.0) + 1  # mscale(factor 4, mscale_all_dim 0.5)
    assert s.score_scale == pytest.approx((DN + DR) ** -0.5 * m_all**2, rel=1e-12)
    assert s.score_scale == model.model.layers[0].self_attn.scaling
    mla = lay.extra["mla"]
    assert (mla["kv_lora_rank"], mla["q_lora_rank"], mla["key_scalar"]) == (R, RQ, "content part only")
    assert mla["rope_attention_factor"] == pytest.approx((0.1 * math.log(4.0) + 1) / m_all, rel=1e-12)
    assert lay.extra["rotary_style"] == "interleaved"
    # the rotary key columns are one vector shared by every head; the content columns differ per head
    assert torch.equal(lay.W_K[0, :, DN:], lay.W_K[-1, :, DN:])
    assert not torch.equal(lay.W_K[0, :, :DN], lay.W_K[1, :, :DN])


def test_rotary_styles(tmp_path):
    for name, style in (("v2", "interleaved"), ("v3-half-bias", "half")):
        _, path = build(name, tmp_path)
        assert load_layers(path)[0].extra["rotary_style"] == style, name


def test_fp8_checkpoint_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    from qkinspect.errors import UnsupportedModelError

    _, path = build("v3", tmp_path)
    f = path / "model.safetensors"
    state = load_file(f)
    state["model.layers.0.self_attn.kv_b_proj.weight_scale_inv"] = torch.ones(1, 1)
    save_file(state, f, metadata={"format": "pt"})
    with open_model(path) as m, pytest.raises(UnsupportedModelError, match="FP8"):
        m.layer("decoder", 0)


@pytest.mark.parametrize("name", ["v3", "v2-lite"])
def test_cli_info_and_analyze(name, tmp_path):
    _, path = build(name, tmp_path)
    r = CliRunner().invoke(app, ["info", str(path), "--format", "json"])
    assert r.exit_code == 0, r.output
    b = json.loads(r.output)["model"]["blocks"][0]
    assert (b["n_kv_heads"], b["d_head"], b["d_head_v"], b["rotary_dims"]) == (H, DN + DR, DV, DR)
    for fold in ([], ["--fold-ln"]):
        r = CliRunner().invoke(app, ["analyze", str(path), "--layers", "0", "--format", "json", *fold])
        assert r.exit_code == 0, r.output
        out = json.loads(r.output)
        assert out["processing"]["fold_ln"] == bool(fold)
        heads = out["heads"]
        assert [(h["layer"], h["head"]) for h in heads] == [(0, i) for i in range(H)]
        assert all(math.isfinite(h["symmetry"]) for h in heads)


@pytest.mark.slow
def test_info_reads_the_config_without_transformers(tmp_path):
    """`qkinspect info` answers from config.json alone for the default RoPE; YaRN (not modelled) is read by
    transformers, and the import shows (the positive control)."""
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom qkinspect.cli.app import app\n"
            "r = CliRunner().invoke(app, ['info', sys.argv[1]])\nassert r.exit_code == 0, r.output\n"
            "print('transformers.models.deepseek_v3.configuration_deepseek_v3' in sys.modules)")
    for name, imported in (("v3", "False"), ("v3-yarn", "True")):
        _, path = build(name, tmp_path)
        out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().splitlines()[-1] == imported, name
