"""`--estimate` against dense references on tiny random models: the first-order term is the loss's directional
derivative along Δo_h (autograd, independently of the estimate's leaves), the curvature term is the Gauss-Newton
quadratic form Δoᵀ Jᵀ F J Δo / 2N (J Δo by autograd), the estimate's error shrinks as t² for an edit scaled by t,
each head's Δo_h from the all-heads rerun is the single-head edit's change of the output projection, and the
identities of the terms (hypothesis)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from qkinspect.experiment.edits.apply import apply_edit
from qkinspect.experiment.edits.names import parse_edit
from qkinspect.experiment.estimate import (
    _get,
    combine,
    estimate_heads,
    head_dots,
    head_outputs,
    projected,
    sites,
)
from qkinspect.experiment.model.runtime import DRIFT
from qkinspect.experiment.model.scoring import Scorer, default_text, logits_and_targets, windows
from qkinspect.experiment.model.writeback import written
from tests.experiment import tiny_models as tiny
from tests.experiment.test_run import opened

TOKENS, WINDOW = 96, 32


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("estimate_models")
    return {"llama": tiny.llama(root / "llama"), "bert": tiny.bert(root / "bert"),
            "bare": tiny.bert(root / "bare", head=False), "gpt2": tiny.gpt2(root / "gpt2"),
            "qwen2": tiny.qwen2(root / "qwen2")}


def _setup(folder):
    hf, layers = opened(folder)
    s = Scorer(hf, windows(hf, default_text(), TOKENS, WINDOW), batch_tokens=64)
    s.baseline(cache=set(layers))
    return hf, layers, s


def _o_proj_change(hf, s, layer, edited):
    """Per batch, the change of `layer`'s output projection output when `edited` is written back (every other
    input clean): the attention module run on the clean pass's inputs, with and without the edit."""
    block = hf.layers[layer]
    site = sites(block)
    inputs = []

    def keep_in(m, a, k):
        inputs.append((a, k))

    h = _get(block, site.attention).register_forward_pre_hook(keep_in, with_kwargs=True)
    try:
        s.score()
    finally:
        h.remove()

    def run(args_kwargs):
        got = {}
        hook = _get(hf.layers[layer], site.output).register_forward_hook(lambda m, a, o: got.setdefault("o", o))
        try:
            with torch.no_grad():
                _get(hf.layers[layer], site.attention)(*args_kwargs[0], **args_kwargs[1])
        finally:
            hook.remove()
        return got["o"]

    clean = [run(x) for x in inputs]
    with written(hf, [edited]):
        new = [run(x) for x in inputs]
    return [b - a for a, b in zip(clean, new, strict=True)]


def _loss_along(hf, s, layer, delta, eps):
    """The mean loss (grad-enabled) with eps * delta[b] added to `layer`'s output projection, and the logits
    (or final hidden states for drift) per batch."""
    block = hf.layers[layer]
    out_mod = _get(block, sites(block).output)
    count = {"b": 0}

    def add(m, a, o):
        return o + eps * delta[count["b"]]

    h = out_mod.register_forward_hook(add)
    total, n, outs = 0.0, 0, []
    try:
        for b, inputs in enumerate(s.inputs):
            count["b"] = b
            res = hf.model(**{k: v for k, v in inputs.items() if k != "labels"})
            if hf.kind == DRIFT:
                outs.append(res.last_hidden_state)
                continue
            pred, target = logits_and_targets(res.logits, inputs, hf.kind)
            outs.append((pred, target))
            total = total + F.cross_entropy(pred.reshape(-1, pred.shape[-1]), target.reshape(-1), reduction="sum",
                                            ignore_index=-100)
            n += int((target != -100).sum())
    finally:
        h.remove()
    return (total / n if n else None), outs


@pytest.mark.parametrize("family,edit", [("llama", "share_qk"), ("gpt2", "share_qkv"), ("bert", "symmetric"),
                                         ("qwen2", "rank:2")])
def test_first_order_term_is_the_directional_derivative(models, family, edit):
    hf, layers, s = _setup(models[family])
    layer, head = 1, 2
    (est,) = estimate_heads(s, {layer: layers[layer]}, [head], [parse_edit(edit)], probes=4)
    delta = _o_proj_change(hf, s, layer, apply_edit(layers[layer], parse_edit(edit), [head]).layer)
    eps = torch.zeros((), requires_grad=True)
    loss, _ = _loss_along(hf, s, layer, delta, eps)
    (d,) = torch.autograd.grad(loss, eps)
    assert est.first == pytest.approx(float(d), rel=1e-4, abs=1e-9 * abs(float(loss.detach())))
    # a real edit moves the head's output (>= 7e-5 measured): the derivative itself is as small as 1e-8 on a tiny
    # random model (bert, symmetric) and is no test of that
    assert max(float(x.abs().max()) for x in delta) > 1e-5


@pytest.mark.parametrize("family", ["llama", "bert", "bare", "gpt2"])
def test_curvature_term_is_the_gauss_newton_form(models, family):
    hf, layers, s = _setup(models[family])
    hf.model.set_attn_implementation("eager")  # the reference differentiates twice; CPU sdpa cannot
    layer, head, edit = 0, 1, parse_edit("share_qk")
    (est,) = estimate_heads(s, {layer: layers[layer]}, [head], [edit], probes=256, seed=3)
    delta = _o_proj_change(hf, s, layer, apply_edit(layers[layer], edit, [head]).layer)
    eps = torch.zeros((), requires_grad=True)
    _, outs = _loss_along(hf, s, layer, delta, eps)
    gn, n = 0.0, 0
    for out in outs:  # J Δo by the double-backward trick: ∂/∂u ⟨u, ∂y/∂ε⟩
        y = out if hf.kind == DRIFT else out[0]
        u = torch.zeros_like(y, requires_grad=True)
        (dy,) = torch.autograd.grad((u * y).sum(), eps, create_graph=True)
        (v,) = torch.autograd.grad(dy, u, retain_graph=True)  # J Δo, shaped as y
        if hf.kind == DRIFT:
            unit = (y / y.norm(dim=-1, keepdim=True)).detach()
            perp = v - (v * unit).sum(-1, keepdim=True) * unit
            gn += float((perp.pow(2).sum(-1) / y.detach().pow(2).sum(-1)).sum())
            n += y.shape[0] * y.shape[1]
        else:
            scored = out[1] != -100
            p = torch.softmax(y.detach()[scored].double(), -1)
            w = v[scored].double()
            gn += float(((w * w * p).sum(-1) - (w * p).sum(-1) ** 2).sum())  # wᵀ (diag p − p pᵀ) w
            n += int(scored.sum())
    reference = gn / (2 * n)
    assert reference > 0
    assert abs(est.curvature - reference) < 4 * est.se + 1e-6 * reference, (est.curvature, est.se, reference)
    assert est.se < 0.5 * reference  # 256 probes pin it down


def test_error_of_a_scaled_edit_shrinks_as_t_squared(models):
    hf, layers, s = _setup(models["llama"])
    layer, head, edit = 1, 0, parse_edit("ablate")
    (est,) = estimate_heads(s, {layer: layers[layer]}, [head], [edit], probes=64)
    delta = _o_proj_change(hf, s, layer, apply_edit(layers[layer], edit, [head]).layer)
    with torch.no_grad():
        base, _ = _loss_along(hf, s, layer, delta, 0.0)
        errors = []
        for t in (0.4, 0.2, 0.1):
            exact = float(_loss_along(hf, s, layer, delta, t)[0] - base)
            errors.append(abs(exact - (t * est.first + t * t * est.curvature)))
            assert errors[-1] < 0.2 * abs(exact)
    # exact to first order: the rest (Gauss-Newton against the full Hessian, Monte-Carlo) is of order t²
    assert errors[0] / errors[1] > 3 and errors[1] / errors[2] > 3, errors


@pytest.mark.parametrize("family,edit", [("llama", "share_qk"), ("gpt2", "share_qkv"), ("bert", "rank:3"),
                                         ("qwen2", "ablate")])
def test_the_all_heads_rerun_gives_each_heads_own_change(models, family, edit):
    """One rerun with every head edited gives each head's Δo_h = z'_h W'_O[h] − z_h W_O[h], which is exactly the
    change of the output projection when that head alone is edited."""
    from qkinspect.experiment.estimate import _Capture, rerun_z

    hf, layers, s = _setup(models[family])
    layer = 1
    all_heads = apply_edit(layers[layer], parse_edit(edit)).layer
    cap = _Capture(hf, [layer], leaves=False)
    try:
        s.score()  # the last batch's inputs stay captured
    finally:
        cap.remove()
    with written(hf, [all_heads]):
        z_new = rerun_z(hf, layer, cap.inputs[layer])
    per_head = head_outputs(z_new, all_heads.W_O.float()) - head_outputs(cap.z[layer], layers[layer].W_O.float())
    for h in range(layers[layer].spec.n_heads):
        alone = _o_proj_change(hf, s, layer, apply_edit(layers[layer], parse_edit(edit), [h]).layer)[-1]
        ref = alone.reshape(-1, alone.shape[-1])
        assert float((per_head[:, h] - ref).norm() / ref.norm()) < 1e-4, h  # float32 rounding of a difference


@pytest.mark.parametrize(("family", "edit"), [("llama", "share_qk"), ("bert", "rank:2"), ("gpt2", "ablate")])
def test_reach_is_the_heads_change_against_its_layers_whole_output(models, family, edit):
    """reach = |Δo_h| / |o| over every token, o the output projection's whole output (every head and the bias),
    against each single-head edit's change of that output and the output itself, both from the model's modules."""
    hf, layers, s = _setup(models[family])
    H = layers[1].spec.n_heads
    found = estimate_heads(s, {1: layers[1]}, list(range(H)), [parse_edit(edit)], probes=2)
    site = sites(hf.layers[1])
    outs = []
    hook = _get(hf.layers[1], site.output).register_forward_hook(lambda m, a, o: outs.append(o.double()))
    try:
        s.score()
    finally:
        hook.remove()
    whole = sum(float(o.pow(2).sum()) for o in outs)
    for x in found:
        change = _o_proj_change(hf, s, 1, apply_edit(layers[1], parse_edit(edit), [x.head]).layer)
        ref = (sum(float(d.double().pow(2).sum()) for d in change) / whole) ** 0.5
        # float32 differences of outputs, against a change of reach · |o|
        assert x.reach == pytest.approx(ref, rel=1e-4, abs=1e-6), (family, x.head)


def test_an_edit_that_changes_nothing_is_estimated_at_zero(models):
    hf, layers, s = _setup(models["llama"])
    d = layers[2].spec.d_head
    ests = estimate_heads(s, {2: layers[2]}, [0, 1, 2, 3], [parse_edit(f"rank:{d}")], probes=8)
    scale = max(abs(x.first) for x in estimate_heads(s, {2: layers[2]}, [0, 1], [parse_edit("ablate")], probes=2))
    for x in ests:
        assert abs(x.estimate) < 1e-4 * scale and x.moved < 1e-4 and not x.unreliable


finite = st.floats(-3, 3, allow_nan=False, allow_infinity=False)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), finite, finite)
def test_head_dots_identities(seed, a, b):
    g = torch.Generator().manual_seed(seed)
    M, H, d, D, K = 5, 3, 2, 4, 2
    G = torch.randn(K, M, D, generator=g, dtype=torch.float64)
    W_O = torch.randn(H, d, D, generator=g, dtype=torch.float64)
    z = torch.randn(M, H * d, generator=g, dtype=torch.float64)
    dz1, dz2 = (torch.randn(M, H * d, generator=g, dtype=torch.float64) for _ in range(2))
    W2 = torch.randn(H, d, D, generator=g, dtype=torch.float64)
    for k in range(K):
        # an identity edit gives 0; the term is linear in Δz; it is ⟨G, Δo_h⟩ with Δo_h formed densely
        assert torch.equal(head_dots(G[k], W_O, z, W_O, z), torch.zeros(H, dtype=torch.float64))
        lin = head_dots(G[k], W_O, z, W_O, z + a * dz1 + b * dz2)
        parts = a * head_dots(G[k], W_O, z, W_O, z + dz1) + b * head_dots(G[k], W_O, z, W_O, z + dz2)
        assert torch.allclose(lin, parts, rtol=1e-9, atol=1e-9)
        dense = (G[k][:, None, :] * (head_outputs(z + dz1, W2) - head_outputs(z, W_O))).sum((0, 2))
        assert torch.allclose(head_dots(G[k], W_O, z, W2, z + dz1), dense, rtol=1e-9, atol=1e-9)
        assert torch.allclose(head_dots(G[k], W_O, z, W2, z + dz1, clean=projected(G[k], W_O)), dense)
    dots = torch.stack([head_dots(G[k], W_O, z, W_O, z + dz1) for k in range(K)])
    first, curv, se = combine(torch.zeros(H), dots, n=7)
    first2, curv2, se2 = combine(torch.zeros(H), a * dots, n=7)
    assert torch.allclose(curv2, a * a * curv, rtol=1e-9, atol=1e-12)  # quadratic in Δo
    assert torch.allclose(se2, a * a * se, rtol=1e-9, atol=1e-12)
    assert (curv >= 0).all() and (se >= 0).all()


@pytest.mark.parametrize("family", ["llama", "bert", "bare", "gpt2", "qwen2"])
def test_run_experiment_estimates_every_head_and_verifies_some(models, family):
    from qkinspect.experiment import run_experiment

    r = run_experiment(models[family], "share_qk", layers=[1], tokens=TOKENS, window=WINDOW, estimate=True,
                       probes=4, verify=2)
    H = 4
    assert [(x.edit, x.head) for x in r.runs] == [(e, h) for h in range(H) for e in ("share_qk", "ablate")]
    for x in r.runs:
        assert x.scope == "head" and x.layer == 1 and x.dloss_estimate is not None
        assert x.dloss_estimate_se is not None and x.dloss_estimate_se >= 0 and x.moved >= 0
        assert (x.dloss is None) == (x.loss is None) == (x.dloss_se is None)
    for e in ("share_qk", "ablate"):
        assert sum(x.dloss is not None for x in r.runs if x.edit == e) == 2  # exact where verified only
    assert r.estimate is not None and r.estimate.probes == 4
    assert [a.edit for a in r.estimate.agreement] == ["share_qk", "ablate"]
    assert all(a.verified == 2 for a in r.estimate.agreement)


def test_verification_picks_the_extremes_the_flagged_and_a_seeded_sample():
    from qkinspect.experiment.estimate import HeadEstimate, choose

    excess = {13: 1.0, 21: 0.5, 25: 0.2}  # spot − estimate of the flagged heads, in units of 0.1 (their spot_se)
    found = [HeadEstimate(layer=h // 10, head=h % 10, edit="share_qk", first=float(h), curvature=0.0, se=0.0,
                          moved=0.5, reach=0.05 + 0.1 * (h in excess), unreliable=h in excess,
                          spot=float(h) + excess[h] if h in excess else None, spot_se=0.1 if h in excess else None,
                          predicted=None, offset0=False)
             for h in range(40)]
    chosen, sampled = choose(found, 8, seed=1)
    keys = {(x.layer, x.head) for x in chosen}
    assert len(chosen) == 8
    # 2 cheapest, 2 costliest, the 2 flagged furthest above their estimate (of 3), then a seeded sample
    assert {(0, 0), (0, 1), (3, 8), (3, 9), (1, 3), (2, 1)} <= keys
    assert len(sampled) == 2 and sampled <= keys and sampled.isdisjoint({(1, 3), (2, 1)})
    assert choose(found, 8, seed=1) == (chosen, sampled)
    assert len(choose(found, 100)[0]) == 40


def test_estimate_refusals(models):
    from qkinspect.errors import InputError
    from qkinspect.experiment import run_experiment

    with pytest.raises(InputError, match="scope='head'"):
        run_experiment(models["llama"], "share_qk", scope="layer", estimate=True)
    with pytest.raises(InputError, match="verify applies to estimate"):
        run_experiment(models["llama"], "share_qk", verify=3)
    with pytest.raises(InputError, match="probes=1"):
        run_experiment(models["llama"], "share_qk", estimate=True, probes=1)
