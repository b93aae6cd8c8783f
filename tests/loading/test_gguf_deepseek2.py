"""deepseek2 GGUF files (DeepSeek's MLA as llama.cpp stores it) beyond the per-architecture proof of
tests/loading/test_gguf_arch.py: a Q8_0 file (the split kv_b rebuilt from the dequantised halves), the CLI on a
converted file, and the refusals, each one line naming the file."""

from __future__ import annotations

import json
import math

import gguf
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from qkinspect.cli.app import app
from qkinspect.errors import InputError
from qkinspect.loading import open_model
from qkinspect.loading.gguf import open_gguf
from tests.loading.gguf_convert import MLA, tiny_model, write_gguf

KV_B = "model.layers.{i}.self_attn.kv_b_proj.weight"


@pytest.fixture(scope="module")
def v2(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("v2")
    config, model = tiny_model("deepseek2")
    return config, model, write_gguf(tmp / "v2.gguf", "deepseek2", config, model)


def test_q8_0_split_kv_b_is_the_dequantised_halves_and_close_to_the_model(tmp_path, monkeypatch):
    """Q8_0 needs rows of 32: widths of 32 throughout. kv_b_proj read from the file is, head by head, the dequantised
    attn_k_b block transposed over the dequantised attn_v_b block, and the composed layers are within Q8_0's error
    of the same model's safetensors layers."""
    import tests.loading.gguf_convert as conv

    wide = {**MLA, "hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 32,
            "kv_lora_rank": 32, "qk_nope_head_dim": 32, "qk_rope_head_dim": 32, "v_head_dim": 32}
    monkeypatch.setitem(conv.CASES, "deepseek2", ("deepseek_v2", wide, "rms"))
    config, model = tiny_model("deepseek2")
    model.save_pretrained(tmp_path / "hf")
    path = write_gguf(tmp_path / "q8.gguf", "deepseek2", config, model, qtype=gguf.GGMLQuantizationType.Q8_0)
    H, dn, dv = 2, 32, 32
    _, src = open_gguf(path)
    raw = {t.name: t for t in src._reader.tensors}
    for i in range(config.num_hidden_layers):
        k_b, v_b = (torch.from_numpy(gguf.quants.dequantize(raw[f"blk.{i}.attn_{x}.weight"].data,
                                                            gguf.GGMLQuantizationType.Q8_0).copy())
                    for x in ("k_b", "v_b"))
        assert src.stored_dtype(KV_B.format(i=i)) == "q8_0"
        got = src.get(KV_B.format(i=i))
        for h in range(H):
            rows = got[h * (dn + dv):(h + 1) * (dn + dv)]
            assert torch.equal(rows[:dn], k_b.reshape(H, -1, dn)[h].T), (i, h)
            assert torch.equal(rows[dn:], v_b.reshape(H, dv, -1)[h]), (i, h)
        want = model.state_dict()[KV_B.format(i=i)]
        assert (got - want).abs().max() < 0.02 * want.abs().max()
    with open_model(tmp_path / "hf") as a, open_model(path) as b:
        assert b.info.dtype == "float32+q8_0" and a.info.blocks == b.info.blocks  # norms stay F32
        for x, y in zip(a.layers(), b.layers(), strict=True):
            for name in ("W_Q", "W_K", "W_V", "W_O"):
                want, got = getattr(x, name), getattr(y, name)
                assert (got - want).norm() < 0.02 * want.norm(), (x.layer, name)


def test_cli_info_and_analyze(v2):
    config, _, path = v2
    r = CliRunner().invoke(app, ["info", str(path), "--format", "json"])
    assert r.exit_code == 0, r.output
    b = json.loads(r.output)["model"]["blocks"][0]
    d, dr = config.qk_nope_head_dim + config.qk_rope_head_dim, config.qk_rope_head_dim
    assert (b["n_heads"], b["n_kv_heads"], b["d_head"], b["d_head_v"], b["rotary_dims"]) == (4, 4, d, 6, dr)
    r = CliRunner().invoke(app, ["analyze", str(path), "--format", "json"])
    assert r.exit_code == 0, r.output
    heads = json.loads(r.output)["heads"]
    assert [(h["layer"], h["head"]) for h in heads] == [(i, h) for i in range(2) for h in range(4)]
    assert all(math.isfinite(h["symmetry"]) for h in heads)


# -- refusals: a hand-written one-layer file with one thing changed -----------------------------------------------

D, H, RQ, R, DN, DR, DV = 64, 4, 24, 16, 8, 4, 6
META = {"block_count": 1, "embedding_length": D, "attention.head_count": H, "attention.head_count_kv": 1,
        "attention.q_lora_rank": RQ, "attention.kv_lora_rank": R, "attention.key_length": R + DR,
        "attention.value_length": R, "attention.key_length_mla": DN + DR, "attention.value_length_mla": DV,
        "rope.dimension_count": DR, "attention.layer_norm_rms_epsilon": 1e-5}
TENSORS = {"attn_norm": (D,), "attn_q_a": (RQ, D), "attn_q_a_norm": (RQ,), "attn_q_b": (H * (DN + DR), RQ),
           "attn_kv_a_mqa": (R + DR, D), "attn_kv_a_norm": (R,), "attn_k_b": (H, R, DN), "attn_v_b": (H, DV, R),
           "attn_output": (D, H * DV)}
YARN = {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 16,
        "rope.scaling.yarn_log_multiplier": 0.1}


def write(path, meta=None, tensors=None, drop=()):
    w = gguf.GGUFWriter(str(path), "deepseek2")
    for key, v in {**META, **(meta or {})}.items():
        if v is None:
            continue
        add = w.add_string if isinstance(v, str) else w.add_float32 if isinstance(v, float) else w.add_uint32
        add(f"deepseek2.{key}", v)
    rng = np.random.default_rng(0)
    for role, shape in {**TENSORS, **(tensors or {})}.items():
        if role not in drop:
            w.add_tensor(f"blk.0.{role}.weight", rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


REFUSED = {
    "both-queries": (dict(tensors={"attn_q": (H * (DN + DR), D)}), "both attn_q and attn_q_a"),
    "no-query": (dict(drop=("attn_q_a", "attn_q_a_norm", "attn_q_b")), "neither attn_q nor attn_q_a"),
    "both-kv-forms": (dict(tensors={"attn_kv_b": (H * (DN + DV), R)}), "both attn_kv_b and attn_k_b"),
    "half-pair": (dict(drop=("attn_v_b",)), r"blk\.0\.attn_v_b\.weight is missing"),
    "k_b-not-transposed": (dict(tensors={"attn_k_b": (H, DN, R)}), "not llama.cpp's split kv_b"),
    "v_b-heads": (dict(tensors={"attn_v_b": (H * DV, R)}), "not llama.cpp's split kv_b"),
    "no-content-dims": (dict(meta={"attention.key_length_mla": DR}), "no content dims"),
    "split-without-widths": (dict(meta={"attention.key_length_mla": None}), "without attention.key_length_mla"),
    "attn-factor": (dict(meta={**YARN, "rope.scaling.yarn_attn_factor": 0.5}), "yarn_attn_factor"),
    "scaling-type": (dict(meta={"rope.scaling.type": "linear", "rope.scaling.factor": 2.0}), "'linear'"),
    "temperature": (dict(meta={"attention.temperature_scale": 0.1}), "temperature_scale"),
    "no-kv-lora-rank": (dict(meta={"attention.kv_lora_rank": 0}), "kv_lora_rank"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_in_one_line(case, tmp_path):
    kw, pattern = REFUSED[case]
    path = write(tmp_path / f"{case}.gguf", **kw)
    with pytest.raises(InputError, match=pattern) as e:
        with open_model(path) as m:
            list(m.layers())
    assert e.value.exit_code == 2 and "\n" not in str(e.value) and str(path) in str(e.value)
    r = CliRunner().invoke(app, ["info", str(path)])
    assert r.exit_code == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.output


@pytest.mark.parametrize("meta", [{}, YARN], ids=["plain", "yarn"])
def test_the_hand_written_file_is_read(meta, tmp_path):
    """The positive control of the refusals: the unchanged file opens and composes (YaRN: mscale_all_dim 1 back from
    the float32 multiplier exactly; scale (d)^-1/2 times mscale(4, 1)², rotary part without a further factor)."""
    with open_model(write(tmp_path / "ok.gguf", meta)) as m:
        lay = next(m.layers())
        s = m.info.blocks[0]
        rope = m.resolved.config.rope_parameters
    assert lay.W_K.shape == (H, D, DN + DR) and lay.W_V.shape == (H, D, DV)
    assert torch.equal(lay.W_K[0, :, DN:], lay.W_K[-1, :, DN:])  # the rotary key part is shared
    m_all = 0.1 * math.log(4.0) + 1 if meta else 1.0
    assert s.score_scale == pytest.approx((DN + DR) ** -0.5 * m_all**2, rel=1e-12)
    assert lay.extra["mla"]["rope_attention_factor"] == 1.0
    if meta:
        assert rope["mscale_all_dim"] == 1.0 and rope["attention_factor"] == 1.0
