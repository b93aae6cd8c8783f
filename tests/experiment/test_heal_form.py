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


def _grads(healer, ids):
    """The loss and every trained parameter's gradient of one training forward + backward (inside `cached`)."""
    healer.model.train()
    for p in healer.params:
        p.grad = None
    with cached(healer._forms()):
        loss = healer.model(input_ids=ids, labels=ids).loss
        loss.backward()
    return float(loss.detach()), [p.grad.clone() if p.grad is not None else None for p in healer.params]


def _same_grads(hf, edit, heads, monkeypatch):
    """A healer with the projections' forwards (`projections`) against one with every projection reading its
    gathered weight: the same loss and gradients to float rounding."""
    import qkinspect.experiment.edits.parametrised as parametrised

    fast, ids = _healer(hf, edit, heads)
    with monkeypatch.context() as m:
        m.setattr(parametrised, "projections", lambda *a: {})
        slow, _ = _healer(hf, edit, heads)
    assert not any("forward" in mod.__dict__ for mod in slow.model.modules())
    (a, ga), (b, gb) = _grads(fast, ids), _grads(slow, ids)
    assert abs(a - b) <= 1e-6 * abs(b)
    assert len(ga) == len(gb)
    for x, y in zip(ga, gb, strict=True):
        assert (x is None) == (y is None)
        if x is not None:
            torch.testing.assert_close(x, y, rtol=0, atol=1e-5 * max(float(y.abs().max()), 1e-12))
    return fast


@pytest.mark.parametrize("edit", EDITS)
@pytest.mark.parametrize("which", ["all", "one"])
def test_projections_compute_what_the_gathered_weights_compute(models, edit, which, monkeypatch):
    hf, _ = models["llama"]
    _same_grads(hf, edit, list(range(4)) if which == "all" else [1], monkeypatch)


def test_projections_compute_the_shared_key_once_and_the_values_on_their_rows(models, monkeypatch):
    """share_qk on every head of a grouped-query layer (4 heads, 2 value rows): q_proj and k_proj are one matmul
    within a step, v_proj multiplies the 2 value rows and no gathered W_V is built; outside `cached`, and where
    the first output was changed in place, each projection computes its own."""
    import qkinspect.experiment.edits.parametrised as parametrised

    hf, _ = models["llama"]
    healer, ids = _healer(hf, "share_qk", list(range(4)))
    form, _ = healer.forms[LAYER]
    a = healer.model.model.layers[LAYER].self_attn
    assert {n: type(m.__dict__.get("forward")).__name__ for n, m in a.named_children()} == {
        "q_proj": "_Projection", "k_proj": "_Projection", "v_proj": "_Projection", "o_proj": "NoneType"}
    assert form.deferred == {"W_V"}
    calls: list[int] = []
    compute = parametrised._Projection.compute
    monkeypatch.setattr(parametrised._Projection, "compute", lambda self, x: calls.append(1) or compute(self, x))
    gathered: list[str] = []  # the canonical tensors read through their heads' rows (`take`)
    free = parametrised.EditForm._free
    monkeypatch.setattr(parametrised.EditForm, "_free", lambda self, n: gathered.append(n) or free(self, n))
    x = torch.randn(1, 5, 64)
    with cached([form]):
        q = a.q_proj(x)
        assert a.k_proj(x) is q and len(calls) == 1
        v = a.v_proj(x)
        assert v.shape == (1, 5, 64) and "W_V" not in gathered  # the forward built no gathered value
        torch.testing.assert_close(v, x @ a.v_proj.weight.T, rtol=0, atol=1e-6)  # reading the weight gathers it
        assert gathered.count("W_V") == 1
        assert a.v_proj.weight.shape == (64, 64) and gathered.count("W_V") == 1  # once per `cached` block
        q = a.q_proj(x)
        q.mul_(2)  # changed in place: the pair's other projection computes its own
        torch.testing.assert_close(a.k_proj(x), q / 2, rtol=0, atol=0)
    calls.clear()
    k = a.k_proj(x)
    assert a.q_proj(x) is not k and len(calls) == 2  # no sharing outside `cached`


def test_projections_are_only_given_where_they_apply(models):
    """One edited head of a group: the keys are gathered (a tie copies them into the queries), the values are
    still rows; a fused projection (GPT-2's c_attn) keeps its gathered weight."""
    hf, _ = models["llama"]
    healer, _ = _healer(hf, "share_qk", [1])
    a = healer.model.model.layers[LAYER].self_attn
    assert {n for n, m in a.named_children() if "forward" in m.__dict__} == {"v_proj"}
    assert healer.forms[LAYER][0].deferred == {"W_V"}
    hf, _ = models["gpt2"]
    healer, _ = _healer(hf, "share_qk", list(range(4)))
    assert not any("forward" in m.__dict__ for m in healer.model.modules())


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])  # OLMo2's whole-projection norm is not healed
@pytest.mark.parametrize("edit", ["share_qk", "symmetric", "share_qkv"])
def test_projections_on_qk_norm_families(tmp_path, family, edit, monkeypatch):
    """Through q/k norms (the norms read the projections' outputs): the same loss and gradients as the gathered
    weights, with the keys shared and the values on their rows where every head shares its matrix."""
    _, _, hf = open_experiment(str(tiny_models.WRITEBACK_FAMILIES[family](tmp_path / family)), None, [LAYER], None,
                               None)
    heads = list(range(hf.model.config.num_attention_heads))
    healer = _same_grads(hf, edit, heads, monkeypatch)
    a = healer.model.model.layers[LAYER].self_attn
    if edit == "share_qk":
        assert type(a.k_proj.__dict__.get("forward")).__name__ == "_Projection"


def test_attention_only_healing_holds_the_weights_it_does_not_train_once(models):
    """Attention-only: the healed copy's embeddings, MLPs and norms are frozen Parameters over the scored model's
    own memory (no second copy); the projections it trains are its own. After training, the scored model is as
    it was: values, Parameter objects, requires_grad. Every parameter training: nothing shared."""
    hf, _ = models["llama"]
    params = dict(hf.model.named_parameters())
    before = {n: (p.detach().clone(), p.requires_grad) for n, p in params.items()}
    healer, _ = _healer(hf, "share_qk", list(range(4)))
    healer.opts = HealOptions(steps=2, lr=1e-2)
    healer.train()
    held = {p.data_ptr() for p in params.values()}
    own = dict(healer.model.named_parameters())
    shared = {n for n, p in own.items() if p.numel() and p.data_ptr() in held}
    assert {n for n in shared if any(w in n for w in ("mlp", "embed", "norm", "lm_head"))} == shared
    assert {"model.embed_tokens.weight", f"model.layers.{LAYER}.mlp.up_proj.weight"} <= shared
    assert all(not own[n].requires_grad and own[n] is not params[n] for n in shared)
    assert not any(p.data_ptr() in held for p in healer.params)
    assert dict(hf.model.named_parameters()) == params
    for n, p in params.items():
        assert torch.equal(p, before[n][0]) and p.requires_grad == before[n][1], n
    every = Healer(hf, {}, HealOptions(steps=1, train="all"), [], "gauge")
    assert not any(p.data_ptr() in held for p in every.model.parameters())


def test_a_layout_healing_cannot_keep_is_refused_before_any_training(tmp_path, monkeypatch):
    """Grouped-query OLMo2 (one key norm over the whole projection): share_qk on every head gives each query head a
    key of its own, and the write-back repeats the key norm's gains for them, arithmetic a parametrisation cannot
    follow. The run is refused in one line naming the edit and layer before the control trains."""
    from qkinspect.errors import InputError
    from qkinspect.experiment import heal as heal_mod
    from qkinspect.experiment.run import run_experiment
    from tests.experiment.test_heal import _text

    folder = tiny_models.WRITEBACK_FAMILIES["olmo2"](tmp_path / "olmo2")
    monkeypatch.setattr(heal_mod.Healer, "train", lambda *a, **k: pytest.fail("trained before the refusal"))
    with pytest.raises(InputError, match=r"^heal cannot keep share_qk on layer 1 while it trains: the llama "
                                         r"write-back changes values \(self_attn\.k_norm\.weight\)"):
        run_experiment(str(folder), "share_qk", scope="layer", layers=[1], tokens=96, window=32, reference=False,
                       heal=HealOptions(steps=2, batch_tokens=64, text=_text()))


def test_probing_the_layouts_leaves_the_scored_model_as_it_was(models, monkeypatch):
    """probe_layouts writes index probes into the scored model's layers and undoes each: the same modules, the
    same values; the layouts it records are the ones the healers then reuse (no second probe)."""
    from qkinspect.experiment import heal as heal_mod

    hf, _ = models["llama"]
    modules = dict(hf.model.named_modules())
    state = {k: v.clone() for k, v in hf.model.state_dict().items()}
    layouts: dict = {}
    heal_mod.probe_layouts(hf, [[(LAYER, [0, 1, 2, 3])], [(LAYER, [1])]], [parse_edit("share_qk")], "gauge", layouts)
    assert len(layouts) == 1  # keyed by the layer and the edited tensors' shapes: the same for both units
    assert dict(hf.model.named_modules()) == modules
    assert all(torch.equal(hf.model.state_dict()[k], v) for k, v in state.items())
    probed = []
    original = heal_mod.module_maps
    monkeypatch.setattr(heal_mod, "module_maps", lambda *a: probed.append(1) or original(*a))
    Healer(hf, {LAYER: (parse_edit("share_qk"), [1])}, HealOptions(steps=1), [], "gauge", layouts)
    assert not probed
