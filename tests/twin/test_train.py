"""The twins' training: the standard twin is a plain transformers loop; each constrained twin starts from the
standard twin's initial tensors and holds its constraint at every step."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from qkinspect.twin import run as twin_run
from qkinspect.twin.data import batch_starts, gather
from qkinspect.twin.model import build, config_for, standard_model
from qkinspect.twin.request import Shape
from qkinspect.twin.train import lr_at, run_twin
from tests.twin.conftest import TINY

torch.set_num_threads(1)
SHAPES = [Shape("llama", 2, 32, 4, 16), Shape("gpt2", 2, 32, 4, 16)]


def _spec(folder):
    """The runs' spec of a prepared folder (a standard twin trained, so the token streams are written)."""
    return twin_run.prepare(twin_run.check_request(folder, **{k: v for k, v in TINY.items() if k != "workers"},
                                                   steps=12, seeds=1, lr=3e-3, eval_every=6),
                            twin_run.LIBRARY_NAMES)[0]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_standard_twin_is_a_plain_transformers_loop(tmp_path, small_text, arch):
    from transformers import AutoModelForCausalLM

    req = twin_run.check_request(tmp_path, arch=arch, text=small_text, steps=12, seeds=1, lr=3e-3, warmup=3,
                                 **{k: v for k, v in TINY.items() if k != "workers"})
    spec, _ = twin_run.prepare(req, twin_run.LIBRARY_NAMES)
    got = run_twin(str(tmp_path), "standard", 0, 3e-3, spec)["train_losses"]
    # the plain loop: the config, the seed's initialisation, AdamW and the schedule written out, the seed's batches
    cfg = config_for(req.shape, spec["vocab_size"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    train = np.load(tmp_path / "tokens" / "train.npy")
    starts = batch_starts(len(train), 16, 4, 12, seed=0)
    want = []
    for k in range(12):
        lr = 3e-3 * (k + 1) / 3 if k < 3 else 3e-4 + (3e-3 - 3e-4) * 0.5 * (1 + math.cos(math.pi * (k - 3) / 9))
        for g in opt.param_groups:
            g["lr"] = lr
        x = torch.from_numpy(gather(train, starts[k], 16).astype(np.int64))
        logits = model(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        want.append(float(loss.detach()))
    assert got == pytest.approx(want, rel=1e-4, abs=1e-5)


def test_schedule_warms_up_then_decays_to_a_tenth():
    assert lr_at(0, 1.0, 10, 100) == pytest.approx(0.1)
    assert lr_at(9, 1.0, 10, 100) == pytest.approx(1.0)
    assert lr_at(10, 1.0, 10, 100) == pytest.approx(1.0)
    assert lr_at(100, 1.0, 10, 100) == pytest.approx(0.1)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.arch)
@pytest.mark.parametrize("variant", ["share_qk", "symmetric", "share_qkv", "rank:2", "wq_identity",
                                     "share_qk_reformer"])
def test_untouched_tensors_are_the_standard_twins_bit_for_bit(shape, variant):
    from qkinspect.twin.model import state_tensors

    std = state_tensors(standard_model(config_for(shape, 40), seed=3))
    twin = state_tensors(build(variant, shape, 40, seed=3).model)
    # the projections the constraint holds: q and k (and v under share_qkv); GPT-2 fuses them in c_attn
    touched = (("q_proj", "k_proj", "v_proj") if variant == "share_qkv" else ("q_proj", "k_proj")) \
        if shape.arch == "llama" else ("c_attn",)
    same = [k for k in std if not any(t in k for t in touched)]
    assert same and all(torch.equal(std[k], twin[k]) for k in same)
    if shape.arch == "llama" and variant not in ("share_qkv",):
        assert all(torch.equal(std[k], twin[k]) for k in std if "v_proj" in k)


def _canonical(model):
    from qkinspect.loading import open_model

    with open_model(model) as m:
        key = m.info.blocks[0].key
        return [m.layer(key, i) for i in range(m.info.blocks[0].n_layers)]


def _check(variant: str, built) -> None:
    for L in _canonical(built.model):
        Wq, Wk = L.W_Q.double(), L.W_K.double()  # (H, D, d)
        M = Wq @ Wk.transpose(-2, -1)  # (H, D, D)
        scale = float(M.abs().max())
        if variant in ("share_qk", "share_qkv", "share_qk_reformer"):
            assert torch.equal(L.W_Q, L.W_K)
        if variant == "share_qkv":
            assert torch.equal(L.W_V, L.W_K)
        if variant == "share_kv":
            assert torch.equal(L.W_K, L.W_V)
        if variant == "symmetric":
            assert float((M - M.transpose(-2, -1)).abs().max()) <= 1e-6 * scale
        if variant == "rank:2":
            s = torch.linalg.svdvals(M)
            assert float(s[:, 2:].max()) <= 1e-6 * float(s[:, 0].max())
        if variant == "wq_identity":
            eye = torch.eye(L.W_Q.shape[1], dtype=torch.float64)
            assert torch.equal(L.W_Q.double().permute(1, 0, 2).reshape(eye.shape), eye)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("variant", ["share_qk", "symmetric", "share_qkv", "share_kv", "rank:2", "wq_identity",
                                     "share_qk_reformer"])
def test_every_constraint_holds_at_every_step(tmp_path, small_text, arch, variant):
    req = twin_run.check_request(tmp_path, arch=arch, text=small_text, steps=6, seeds=1, lr=1e-2,
                                 **{k: v for k, v in TINY.items() if k != "workers"})
    spec, _ = twin_run.prepare(req, twin_run.LIBRARY_NAMES)
    seen = []

    def on_step(built, k):
        _check(variant, built)
        seen.append(k)

    out = run_twin(str(tmp_path), variant, 0, 1e-2, spec, on_step=on_step)
    assert seen == list(range(1, 7)) and out["violation"] < 1e-5


def test_reformer_mask_holds_in_the_trained_model():
    built = build("share_qk_reformer", SHAPES[0], 40, seed=0)
    got = []
    for block in built.model.model.layers:
        block.self_attn.register_forward_hook(lambda m, a, out: got.append(out[1]))
    with torch.no_grad():
        built.model(input_ids=torch.randint(0, 40, (2, 16)))
    for w in got:  # (B, H, T, T): no position attends to itself but the first, which sees only itself
        diag = w.diagonal(dim1=-2, dim2=-1)
        assert float(diag[..., 1:].abs().max()) == 0.0 and torch.allclose(diag[..., 0], torch.ones(()))
        assert float(w.triu(1).abs().max()) == 0.0


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_matched_arms_have_the_standard_twins_parameters_within_one_percent(arch):
    shape = Shape(arch, 2, 64, 4, 16)
    std = build("standard", shape, 40, seed=0).params
    for variant in ("share_qk+params", "share_qkv+params", "share_kv+params", "bilinear+params"):
        assert abs(build(variant, shape, 40, seed=0).params - std) <= 0.01 * std, variant


def test_training_loss_goes_down(tmp_path, small_text):
    result = twin_run.twin(tmp_path, text=small_text, variants="share_qk", steps=30, seeds=1, lr=1e-2,
                           eval_every=30, **TINY)
    for r in result.runs:
        curve = [p.val_loss for p in result.points if p.variant == r.variant]
        assert len(curve) == 2 and curve[-1] < curve[0]
    doc = json.loads((tmp_path / "twin.json").read_text())
    assert doc["setup"]["evaluation"]["windows"] == 8
