"""Healing's parametrisation (edits/parametrised.py): the healed copy computes what the dense edited model written
back computes, its parameters are the edit's free ones only (grouped-query heads counted), gradients reach those
and nothing else, and the module weights read separate projections as views of them (no copy per step)."""

from __future__ import annotations

import copy

import pytest
import torch

from qkinspect.experiment.edits.apply import apply_edit
from qkinspect.experiment.edits.names import parse_edit
from qkinspect.experiment.edits.parametrised import cached
from qkinspect.experiment.heal import Healer
from qkinspect.experiment.model.runtime import HFModel
from qkinspect.experiment.model.writeback import write_layer
from qkinspect.experiment.requests import HealOptions
from qkinspect.experiment.run import open_experiment
from tests.experiment import tiny_models

LAYER = 1


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("heal_form")
    out = {}
    for family in ("llama", "gpt2"):  # grouped-query separate projections (4 heads, 2 KV); fused c_attn
        _, originals, hf = open_experiment(str(getattr(tiny_models, family)(root / family)), None, [LAYER], None,
                                           None)
        out[family] = (hf, originals[LAYER])
    return out


def _healer(hf, edit, heads):
    ids = torch.arange(40).remainder(30).view(1, 40) + 5
    return Healer(hf, {LAYER: (parse_edit(edit), heads)}, HealOptions(steps=1, batch_tokens=40),
                  [{"input_ids": ids, "use_cache": False}], "gauge"), ids


def _dense(hf, layer, edit, heads):
    """The model with the edited layer written back as plain weights (no parametrisation)."""
    dense = HFModel(copy.deepcopy(hf.model), hf.family, hf.kind, hf.tokenizer)  # float32 already
    write_layer(dense, apply_edit(layer, parse_edit(edit), heads, rotary="gauge").layer)
    return dense.model


EDITS = ["share_qk", "symmetric", "tie_k", "tie_q", "share_qkv", "rank:3", "ablate"]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("edit", EDITS)
@pytest.mark.parametrize("which", ["all", "one"])
def test_forward_equals_the_dense_edited_model(models, family, edit, which):
    hf, layer = models[family]
    heads = list(range(4)) if which == "all" else [1]
    healer, ids = _healer(hf, edit, heads)
    dense = _dense(hf, layer, edit, heads)
    with torch.no_grad(), cached(healer._forms()):
        got = healer.model.eval()(input_ids=ids).logits
    with torch.no_grad():
        want = dense.eval()(input_ids=ids).logits
    # the form reproduces the edited tensors to float32 rounding of its own arithmetic (signs, the rank factors)
    scale = float(want.abs().max())
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * scale)
    assert healer.violation < 1e-6


@pytest.mark.parametrize("edit", EDITS)
@pytest.mark.parametrize("which", ["all", "one"])
def test_gradients_reach_the_free_parameters_only(models, edit, which):
    hf, _ = models["llama"]
    heads = list(range(4)) if which == "all" else [1]
    healer, ids = _healer(hf, edit, heads)
    form, _ = healer.forms[LAYER]
    trained = {id(p) for p in healer.params}
    healer.model.train()
    with cached(healer._forms()):
        healer.model(input_ids=ids, labels=ids).loss.backward()
    for name, p in healer.model.named_parameters():
        if id(p) not in trained:
            assert p.grad is None, name
    for name, p in form.named_parameters():
        if not p.numel() or name in ("A", "C"):  # rank's real-block factors: none in a fully rotary head
            continue
        if edit == "ablate" and which == "all":  # no head's output reaches the residual: q, k, v cannot matter
            assert p.grad is None or not bool(p.grad.any()), name
        else:
            assert p.grad is not None and bool(p.grad.abs().max() > 0), name
    # the constrained-away elements get no update: a query row a tie fills has no parameter, or gets no gradient
    if edit in ("share_qk", "symmetric", "tie_k", "tie_q", "share_qkv") and which == "one":
        assert bool((form.W_Q.grad.view(4, -1)[1] == 0).all())


def test_grouped_query_heads_hold_no_more_than_their_free_rows(models):
    """share_qk on every head of a layer with 4 query heads reading 2 key/value heads: one matrix per head (the
    key IS the query projection, no W_Q parameter), the values still one per group; fewer trained parameters than
    the unedited layer. On one head: that head's key of its own beside the groups' shared ones."""
    hf, _ = models["llama"]
    control = Healer(hf, {}, HealOptions(steps=1), [], "gauge")
    healer, _ = _healer(hf, "share_qk", list(range(4)))
    form, _ = healer.forms[LAYER]
    shapes = {n: tuple(p.shape) for n, p in form.named_parameters()}
    assert "W_Q" not in shapes and form.derived == {"W_Q"}
    assert form.W_K.numel() == 4 * 64 * 16 and form.W_V.numel() == 2 * 64 * 16
    assert healer.n_trained == control.n_trained - 64 * 16 * 2  # +2 key heads, -4 query heads
    one, _ = _healer(hf, "share_qk", [1])
    form, _ = one.forms[LAYER]
    assert form.W_Q.numel() == 4 * 64 * 16
    assert form.W_K.numel() == 3 * 64 * 16  # groups {0, 1}, {2, 3}: head 1's own key, the groups' shared ones
    assert form.W_V.numel() == 2 * 64 * 16


def test_separate_projections_are_read_as_views_of_the_parameters(models):
    """No copy per step where a module weight is one canonical tensor: share_qk on every head reads q_proj and
    k_proj as the same parameter, o_proj as its own."""
    hf, _ = models["llama"]
    healer, _ = _healer(hf, "share_qk", list(range(4)))
    form, _ = healer.forms[LAYER]
    a = healer.model.model.layers[LAYER].self_attn
    with cached(healer._forms()):
        assert a.q_proj.weight.data_ptr() == a.k_proj.weight.data_ptr() == form.W_K.data_ptr()
        assert a.o_proj.weight.data_ptr() == form.W_O.data_ptr()
        assert a.q_proj.weight.shape == (64, 64) and a.v_proj.weight.shape == (64, 64)  # K/V expanded: 4 heads
