"""A constrained twin's start (`init`) and the learning-rate schedule: the draw put in the form is the standard
draw's own tensors (dense references against the standard twin), the nearest form is the edit's, and both are in
the records; the constant schedule holds the rate after the warm-up."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from qkinspect.cli.app import app
from qkinspect.twin import run as twin_run
from qkinspect.twin.model import build, config_for, standard_model, state_tensors
from qkinspect.twin.request import Shape
from qkinspect.twin.train import lr_at
from tests.one_line import one_error_line
from tests.twin.conftest import TINY

torch.set_num_threads(1)
SHAPES = [Shape("llama", 2, 32, 4, 16), Shape("gpt2", 2, 32, 4, 16)]


def _blocks(t: dict, arch: str, D: int, layers: int = 2):
    """Per layer: (W_Q, W_K, W_V) as module weights, and their biases (GPT-2's c_attn split in three)."""
    out = []
    for i in range(layers):
        if arch == "llama":
            a = f"model.layers.{i}.self_attn."
            out.append(tuple(t[f"{a}{p}_proj.weight"] for p in "qkv") + (None, None, None))
        else:
            w, b = t[f"transformer.h.{i}.attn.c_attn.weight"], t[f"transformer.h.{i}.attn.c_attn.bias"]
            out.append((w[:, :D], w[:, D:2 * D], w[:, 2 * D:], b[:D], b[D:2 * D], b[2 * D:]))
    return out


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.arch)
@pytest.mark.parametrize("variant", ["share_qk", "share_qk_reformer", "share_qkv", "symmetric", "share_kv"])
def test_a_drawn_start_is_the_standard_draw_itself(shape, variant):
    std = state_tensors(standard_model(config_for(shape, 40), seed=5))
    built = build(variant, shape, 40, seed=5, init="draw")
    twin = state_tensors(built.model)
    assert built.init == "draw" and built.violation() == 0.0
    touched = {"share_kv": ("k_proj",), "share_qkv": ("q_proj", "k_proj", "v_proj")}.get(variant, ("q_proj", "k_proj"))
    touched = touched if shape.arch == "llama" else ("c_attn",)
    same = [k for k in std if not any(t in k for t in touched)]
    assert same and all(torch.equal(std[k], twin[k]) for k in same), variant  # untouched: bit for bit
    for (q, k, v, bq, bk, _), (sq, _, sv, sbq, _, sbv) in zip(_blocks(twin, shape.arch, 32),
                                                                   _blocks(std, shape.arch, 32), strict=True):
        if variant == "share_kv":  # keys are the draw's values; queries and values untouched
            assert torch.equal(k, sv) and torch.equal(v, sv) and torch.equal(q, sq)
            assert bk is None or (torch.equal(bk, sbv) and torch.equal(bq, sbq))
            continue
        assert torch.equal(q, sq)  # the tied tensor is the draw's W_Q (symmetric: W_Q = W_K diag(s), W_Q the draw's)
        if variant == "symmetric":  # W_K = W_Q diag(s): each query column (llama: row) times a fixed sign
            axis = 0 if shape.arch == "gpt2" else 1  # GPT-2's Conv1D stores [in, out]; llama's Linear [out, in]
            s = (q * k).sum(axis, keepdim=True).sign()
            assert set(s.flatten().tolist()) <= {-1.0, 1.0} and torch.equal(k, q * s)
        else:
            assert torch.equal(k, sq)
        if variant == "share_qkv":
            assert torch.equal(v, sq)
        else:
            assert torch.equal(v, sv)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.arch)
def test_the_nearest_start_is_the_edits_form_at_a_smaller_norm(shape):
    """share_qk's nearest W Wᵀ to the draw's W_Q W_Kᵀ: the same product's symmetric PSD part, about 0.7 of W_K's
    norm (docs/twin.md); share_kv's nearest one matrix to (W_K, W_V) is their mean."""
    std = _blocks(state_tensors(standard_model(config_for(shape, 40), seed=2)), shape.arch, 32)
    qk = _blocks(state_tensors(build("share_qk", shape, 40, seed=2, init="nearest").model), shape.arch, 32)
    kv = _blocks(state_tensors(build("share_kv", shape, 40, seed=2, init="nearest").model), shape.arch, 32)
    for (q, k, *_), (_, sk, sv, *_), (_, k2, v2, *_) in zip(qk, std, kv, strict=True):
        assert torch.equal(q, k) and 0.5 < float(k.norm() / sk.norm()) < 0.85
        assert torch.allclose(v2, (sk + sv) / 2, atol=1e-7) and torch.equal(k2, v2)


def test_rank_wq_identity_and_bilinear_start_the_same_either_way():
    for variant in ("rank:2", "wq_identity", "bilinear"):
        a, b = build(variant, SHAPES[0], 40, seed=1, init="draw"), build(variant, SHAPES[0], 40, seed=1,
                                                                          init="nearest")
        ta, tb = state_tensors(a.model), state_tensors(b.model)
        assert a.init == b.init == ("nearest" if variant == "rank:2" else "draw")
        assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


def test_the_constant_schedule_holds_the_rate_after_the_warm_up():
    assert [lr_at(k, 1.0, 4, 20, "constant") for k in range(6)] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
    assert lr_at(19, 1.0, 4, 20, "constant") == 1.0
    half = lr_at(4 + 8, 1.0, 4, 20)  # cosine half-way: (1 + 0.1) / 2
    assert half == pytest.approx(0.55) and lr_at(19, 1.0, 4, 20) == pytest.approx(0.1 + 0.9 * 0.5 * (
        1 + math.cos(math.pi * 15 / 16)))


def test_the_records_state_the_start_and_the_schedule(tmp_path, small_text):
    kw = {k: v for k, v in TINY.items()}
    result = twin_run.twin(tmp_path, text=small_text, variants="share_qk,rank:2", steps=4, seeds=1, lr=1e-2,
                           init="draw", schedule="constant", **kw)
    assert result.setup["training"]["init"] == "draw" and result.setup["training"]["schedule"] == "constant"
    assert {r.variant: r.init for r in result.runs} == {"standard": "draw", "share_qk": "draw", "rank:2": "nearest"}
    assert {s.variant: s.init for s in result.summaries} == {"standard": "draw", "share_qk": "draw",
                                                             "rank:2": "nearest"}
    doc = json.loads(next((tmp_path / "runs").glob("share_qk-*.json")).read_text())
    assert doc["run"]["init"] == "draw"
    assert result.document()["setup"]["training"]["schedule"] == "constant"
    # another start is another setup: the folder is refused, not mixed
    with pytest.raises(Exception, match="another setup"):
        twin_run.twin(tmp_path, text=small_text, variants="share_qk", steps=4, seeds=1, lr=1e-2, init="nearest",
                      schedule="constant", **kw)


def test_a_folder_from_before_init_reads_back_as_nearest_and_cosine(tmp_path, small_text):
    twin_run.twin(tmp_path, text=small_text, variants="share_qk", steps=2, seeds=1, lr=1e-2, init="nearest", **TINY)
    manifest = json.loads((tmp_path / "twin.json").read_text())
    for k in ("init", "schedule"):  # written as the twin wrote them before these options existed
        del manifest["setup"]["training"][k]
    assert "init" not in manifest["training"] and "schedule" not in manifest["training"]
    (tmp_path / "twin.json").write_text(json.dumps(manifest))
    for path in (tmp_path / "runs").glob("*.json"):
        doc = json.loads(path.read_text())
        del doc["run"]["init"]
        path.write_text(json.dumps(doc))
    from qkinspect.twin.saved import read_twin

    got = read_twin(tmp_path)
    assert got.setup["training"]["init"] == "nearest" and got.setup["training"]["schedule"] == "cosine"
    assert {r.init for r in got.runs} == {"nearest"}


@pytest.mark.parametrize("args, option", [(["--init", "zero"], "--init"), (["--schedule", "linear"], "--schedule")])
def test_a_bad_init_or_schedule_is_one_line(tmp_path, args, option):
    one_error_line(CliRunner().invoke(app, ["twin", "--out", str(tmp_path / "o"), *args]), option)
    assert not (tmp_path / "o").exists()


def test_the_library_names_a_bad_init():
    from qkinspect.errors import InputError
    from qkinspect.twin.request import check_request

    with pytest.raises(InputError, match="init='drawn'.*draw or nearest"):
        check_request("x", init="drawn")


@pytest.mark.parametrize("init", ["draw", "nearest"])
def test_share_kv_under_grouped_query_attention_ties_each_key_head_to_its_value_head(tmp_path, init):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4,
                               "num_key_value_heads": 2, "intermediate_size": 64, "num_hidden_layers": 2,
                               "max_position_embeddings": 16}))
    shape = Shape("llama", 2, 32, 4, 16, cfg)
    std = state_tensors(standard_model(config_for(shape, 40), seed=0))
    built = build("share_kv", shape, 40, seed=0, init=init)
    twin = state_tensors(built.model)
    for i in range(2):
        a = f"model.layers.{i}.self_attn."
        k, v = twin[a + "k_proj.weight"], twin[a + "v_proj.weight"]
        assert k.shape == (2 * 8, 32) and torch.equal(k, v)  # two key/value heads of 8, keys are values
        want = std[a + "v_proj.weight"] if init == "draw" else (std[a + "k_proj.weight"] + std[a + "v_proj.weight"]) / 2
        assert torch.allclose(v, want, atol=1e-7) and torch.equal(twin[a + "q_proj.weight"], std[a + "q_proj.weight"])
    n_std = build("standard", shape, 40, seed=0).params
    assert n_std - built.params == 2 * 16 * 32 and built.violation() == 0.0  # each layer's W_K is W_V


@settings(max_examples=8, deadline=None)
@given(st.sampled_from(["llama", "gpt2"]), st.integers(1, 2), st.sampled_from([1, 2, 4]), st.sampled_from([2, 4]),
       st.sampled_from(["draw", "nearest"]), st.integers(0, 1000))
def test_share_kv_identities(arch, layers, heads, d_head, init, seed):
    """Keys are values at the start and after a step of AdamW; every tensor but the keys (and, for nearest, the
    values) is the standard draw's; the free parameters are the standard's less one W_K (and b_K) a layer."""
    from qkinspect.experiment.heal import adamw
    from qkinspect.twin.train import train_step

    D = heads * d_head
    shape = Shape(arch, layers, D, heads, 8)
    std = state_tensors(standard_model(config_for(shape, 20), seed))
    built = build("share_kv", shape, 20, seed, init=init)
    assert build("standard", shape, 20, seed).params - built.params == layers * (D * D + (D if arch == "gpt2" else 0))
    held = ("k_proj",) + (("v_proj",) if init == "nearest" else ()) if arch == "llama" else ("c_attn",)
    twin = state_tensors(built.model)
    assert all(torch.equal(std[k], twin[k]) for k in std if not any(h in k for h in held))
    opt = adamw(built.trained, 1e-2)
    x = torch.from_numpy(np.random.default_rng(seed).integers(0, 20, size=(2, 9)))
    for _ in range(2):
        for _, k, v, _, bk, bv in _blocks(state_tensors(built.model), arch, D, layers):
            assert torch.equal(k, v) and (bk is None or torch.equal(bk, bv))
        assert built.violation() == 0.0
        train_step(built, opt, x)
