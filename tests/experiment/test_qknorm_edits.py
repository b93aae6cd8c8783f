"""Edits through q/k norms (Qwen3, Qwen3-MoE, Gemma 3, OLMo2; docs/experiments.md, "Edits under q/k norms"):
dense references of the constructions, their identities (hypothesis: nearest folded form, symmetric scores, a
head that already shares its matrix kept), and forward passes of tiny models of every q/k-norm family whose own
norm modules' outputs, captured by forward hooks, give symmetric scores on the edited heads, the others' bit for
bit; rank:K bounds the normalised queries; the estimate and healing on these families; the refusals."""

from __future__ import annotations

import importlib
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkinspect.experiment import apply_edit, parse_edit, run_experiment
from qkinspect.experiment.edits.apply import EditError
from qkinspect.experiment.edits.qknorm import one_matrix
from qkinspect.experiment.model.writeback import written
from tests.experiment import tiny_models as tiny
from tests.experiment.effects import EFFECT
from tests.experiment.test_writeback import T, capture, opened
from tests.metrics.helpers import make_layer

FAMILIES = ("qwen3", "qwen3_moe", "gemma3", "olmo2")
ONE_MATRIX = ("share_qk", "symmetric", "share_qkv")


# -- dense references -----------------------------------------------------------------------------------------


def normed_layer(seed: int, biases: bool = True, scope: str = "head"):
    """A q/k-normed layer (4 query heads on 2 key/value heads, D = 12, d = 4) with gains of both signs and a zero:
    shared (d,) gains (Qwen3, Gemma 3) or (H, d), (G, d) over the projection (OLMo2)."""
    layer = make_layer(seed, H=4, G=2, D=12, d=4, biases=biases)
    rng = np.random.default_rng(seed + 100)
    shape = ((4,), (4,)) if scope == "head" else ((4, 4), (2, 4))
    gq, gk = (torch.tensor(rng.uniform(0.3, 1.5, s) * rng.choice([1.0, 1.0, -1.0], s)) for s in shape)
    gq[..., 3] = 0.0  # a zero gain: invisible to the scores
    extra = {"qk_norm_kind": "rmsnorm", "qk_norm_scope": scope}
    return replace(layer, spec=replace(layer.spec, qk_norm=True), q_norm=gq, k_norm=gk, extra=extra)


def hat(W, b):
    """[W; b] (D+1, d) of one head, numpy."""
    return np.vstack([W.double().numpy(), b.double().numpy()[None]])


def gain(g, h):
    return (g if g.dim() == 1 else g[h]).double().numpy()


@pytest.mark.parametrize("scope", ["head", "projection"])
@pytest.mark.parametrize("name", ["share_qk", "symmetric"])
def test_one_matrix_edits_against_a_dense_reference(name, scope):
    layer = normed_layer(1, scope=scope)
    res = apply_edit(layer, parse_edit(name))
    L = res.layer
    for h in range(4):
        g = h // 2
        c = gain(layer.q_norm, h) * gain(layer.k_norm, g)
        M = hat(layer.W_Q[h], layer.b_Q[h]) @ np.diag(c) @ hat(layer.W_K[g], layer.b_K[g]).T  # (13, 13)
        lam, E = np.linalg.eigh((M + M.T) / 2)
        keep = np.zeros_like(lam, dtype=bool)
        if name == "share_qk":  # inertia of diag(c): p positive, n negative eigenvalues at most
            p, n = int((c > 0).sum()), int((c < 0).sum())
            keep[np.argsort(-lam)[:p]] = True
            keep &= lam > 0
            neg = np.zeros_like(keep)
            neg[np.argsort(lam)[:n]] = True
            keep |= neg & (lam < 0)
        else:  # the eigenvalues largest in modulus, one per non-zero gain
            keep[np.argsort(-np.abs(lam))[:int((c != 0).sum())]] = True
        S = (E * np.where(keep, lam, 0)) @ E.T
        Wq, Wk = hat(L.W_Q[h], L.b_Q[h]), hat(L.W_K[h], L.b_K[h])  # keys expanded: head h's own
        new = Wq @ np.diag(c) @ Wk.T
        np.testing.assert_allclose(new, S, atol=1e-10 * np.abs(S).max())
        assert res.predicted[h] == pytest.approx(np.linalg.norm(S - M) / np.linalg.norm(M), rel=1e-9)
        signs = np.sign((Wq * Wk).sum(0))
        if name == "share_qk":
            assert np.array_equal(Wq, Wk)  # literally one projection, bias included
        else:
            np.testing.assert_allclose(Wk, Wq * np.where(signs == 0, 1, signs), atol=1e-12)  # column signs only
    assert res.offset0_only is False  # not rotary


def test_rank_against_a_dense_reference():
    layer = normed_layer(2)
    K = 2
    res = apply_edit(layer, parse_edit(f"rank:{K}"), heads=[0, 3])
    L = res.layer
    assert torch.equal(L.W_K, layer.W_K) and torch.equal(L.b_Q, layer.b_Q)  # keys and query bias unchanged
    assert torch.equal(L.W_Q[[1, 2]], layer.W_Q[[1, 2]])
    gq, gk = gain(layer.q_norm, 0), gain(layer.k_norm, 0)
    for h in (0, 3):
        g = h // 2
        F = layer.W_Q[h].double().numpy() @ np.diag(gq * gk) @ layer.W_K[g].double().numpy().T
        U, _, _ = np.linalg.svd(F)
        want = U[:, :K] @ U[:, :K].T @ F  # the folded weight form cut to K, on the query side
        got = L.W_Q[h].double().numpy() @ np.diag(gq * gk) @ layer.W_K[g].double().numpy().T
        np.testing.assert_allclose(got, want, atol=1e-10 * np.abs(F).max())
        # g_q = 0 on column 3: that column never reaches a score and is kept
        assert torch.equal(L.W_Q[h][:, 3], layer.W_Q[h][:, 3])
        assert res.predicted[h] == pytest.approx(np.linalg.norm(want - F) / np.linalg.norm(F), rel=1e-9)


# -- identities (hypothesis) ----------------------------------------------------------------------------------


def _gains(d: int):
    return st.lists(st.sampled_from([-1.3, -0.4, 0.0, 0.2, 0.7, 1.0, 2.5]), min_size=d, max_size=d)


def _best_scaled(X: np.ndarray, M: np.ndarray) -> float:
    """min over t >= 0 of ||t X − M||: the folded distance of a one-matrix form at its best scale."""
    dot = max(float((X * M).sum()), 0.0)
    nx = float((X * X).sum())
    return float(np.sqrt(max((M * M).sum() - (dot * dot / nx if nx > 0 else 0.0), 0.0)))


def _rms_scores(W: np.ndarray, s: np.ndarray, c: np.ndarray, X: np.ndarray) -> np.ndarray:
    """The scores u(x) diag(c s) u(y)ᵀ of rows of X, u = xW / rms(xW): what the norms give with W_Q' = W,
    W_K' = W diag(s) and gains whose product is c."""
    Y = X @ W
    U = Y / np.sqrt((Y * Y).mean(-1, keepdims=True) + 1e-12)
    return (U * (c * s)) @ U.T


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(0, 10_000), st.integers(2, 6), st.integers(1, 4), st.data())
def test_one_matrix_is_the_nearest_and_symmetric(seed, R_extra, d, data):
    rng = np.random.default_rng(seed)
    R = d + R_extra
    A, B = rng.standard_normal((R, d)), rng.standard_normal((R, d))
    c = np.array(data.draw(_gains(d)))
    M = A @ np.diag(c) @ B.T
    t = lambda a: torch.tensor(a)[None]  # noqa: E731
    W, s, off2, tot2 = (x[0].numpy() for x in one_matrix(t(A), t(B), t(c), "share_qk"))
    Ws, ss, off2s, _ = (x[0].numpy() for x in one_matrix(t(A), t(B), t(c), "symmetric"))
    assert np.array_equal(s, np.ones(d))
    new = W @ np.diag(c) @ W.T
    assert off2 == pytest.approx(((new - M) ** 2).sum(), rel=1e-9, abs=1e-12)
    assert tot2 == pytest.approx((M * M).sum(), rel=1e-12)
    dist, dist_s = np.sqrt(off2), np.sqrt(off2s)
    slack = 1e-9 * np.sqrt(tot2) + 1e-12
    # nearest among one-matrix forms W diag(c) Wᵀ: no alternative, at its best scale, is nearer
    for X in (A, B, (A + B) / 2, rng.standard_normal((R, d))):
        assert dist <= _best_scaled(X @ np.diag(c) @ X.T, M) + slack
    # symmetric may also flip columns on one side: never farther than share_qk, nor than any signed alternative
    assert dist_s <= dist + slack
    flips = rng.choice([-1.0, 1.0], d)
    for X in (A, B, rng.standard_normal((R, d))):
        assert dist_s <= _best_scaled(X @ np.diag(c * flips) @ X.T, M) + slack
    # the scores through the norms are symmetric in the two tokens, whatever the gains
    X = rng.standard_normal((7, R))
    for w, sg in ((W, s), (Ws, ss)):
        S = _rms_scores(w, sg, c, X)
        assert np.abs(S - S.T).max() <= 1e-12 * max(np.abs(S).max(), 1.0)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.integers(0, 10_000), st.floats(0.1, 10.0), st.sampled_from(["share_qk", "symmetric"]))
def test_a_head_that_already_shares_its_matrix_keeps_its_scores(seed, alpha, name):
    """W_K = α W_Q (α > 0) and positive gains: the scores are already symmetric, and the edit returns √α W_Q,
    which the norms see as W_Q itself (their output does not depend on the projection's scale)."""
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((9, 4))
    c = rng.uniform(0.2, 2.0, 4)
    W, s, off2, tot2 = (x[0].numpy() for x in one_matrix(*(torch.tensor(a)[None] for a in (A, alpha * A, c)),
                                                        name))
    np.testing.assert_allclose(W, np.sqrt(alpha) * A, atol=1e-9 * np.abs(A).max() * max(1, np.sqrt(alpha)))
    assert np.array_equal(s, np.ones(4)) and off2 <= 1e-18 * tot2


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.integers(0, 10_000), st.integers(0, 4), st.data())
def test_rank_through_the_norms_identities(seed, K, data):
    """rank:K on the folded form: its rank is at most K, the keys are untouched, and rank:d changes nothing."""
    layer = normed_layer(seed % 50)
    gq = torch.tensor(data.draw(_gains(4)), dtype=torch.float64)
    layer = replace(layer, q_norm=gq)
    res = apply_edit(layer, parse_edit(f"rank:{K}"), heads=[0, 1, 2, 3])
    assert torch.equal(res.layer.W_K, layer.W_K)
    c = (layer.q_norm * layer.k_norm).double()
    for h in range(4):
        F = res.layer.W_Q[h] @ torch.diag(c) @ layer.W_K[h // 2].T
        sv = torch.linalg.svdvals(F)
        assert (sv[K:] <= 1e-9 * sv[0].clamp_min(1e-300)).all() or not bool(sv.any())
    full = apply_edit(layer, parse_edit("rank:4"))
    torch.testing.assert_close(full.layer.W_Q, layer.W_Q, rtol=1e-10, atol=1e-10)
    assert all(v < 1e-10 or v != v for v in full.predicted.values())  # 0, or NaN for a head with no form


# -- the models' own modules -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("qknorm_models")
    return {f: tiny.WRITEBACK_FAMILIES[f](root / f) for f in FAMILIES}


_OPENED: dict = {}


@pytest.fixture(scope="module")
def models(folders):
    for f in FAMILIES:
        _OPENED.setdefault(f, opened(folders[f]))
    return _OPENED


def normed_qk(got, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q̂ (T, H, d) and k̂ (T, G, d) as the model's own q_norm / k_norm modules output them."""
    q, k = got["q_norm"][1], got["k_norm"][1]
    if q.dim() == 2:  # OLMo2 normalises the whole projection (T, H*d)
        return q.view(T, -1, d), k.view(T, -1, d)
    if q.shape[0] != T:  # Gemma 3 normalises (heads, T, d)
        return q.transpose(0, 1), k.transpose(0, 1)
    return q, k


def asymmetry(q: torch.Tensor, k: torch.Tensor) -> float:
    S = q @ k.T  # (T, T): every token's query against every token's key, unrotated
    return float((S - S.T).abs().max() / S.abs().max())


def heads_for(family: str) -> list[int]:
    return [0, 1, 2, 3] if family == "olmo2" else [1, 2]  # OLMo2: every head together (one RMS per token)


@pytest.mark.parametrize("edit", ONE_MATRIX)
@pytest.mark.parametrize("family", FAMILIES)
def test_one_matrix_edits_give_symmetric_scores_through_the_models_own_norms(models, family, edit):
    hf, layers = models[family]
    ids = torch.arange(5, 5 + T)[None]
    before = capture(hf, 1, ids)
    d, H = layers[1].spec.d_head, layers[1].spec.n_heads
    q0, k0 = normed_qk(before, d)
    rep = H // k0.shape[1]
    heads = heads_for(family)
    res = apply_edit(layers[1], parse_edit(edit), heads=heads)
    assert res.offset0_only  # rotary: built on the unrotated form
    with written(hf, [res.layer]):
        got = capture(hf, 1, ids)
    q, k = normed_qk(got, d)
    assert k.shape[1] == H  # the edited heads were given keys of their own
    for h in range(H):
        if h in heads:
            # float32 module outputs: rounding of a T x T product of unit-RMS rows
            assert asymmetry(q[:, h], k[:, h]) < 1e-5, (h, asymmetry(q[:, h], k[:, h]))
        else:  # untouched: its normalised query and key bit for bit, and still asymmetric
            assert torch.equal(q[:, h], q0[:, h]) and torch.equal(k[:, h], k0[:, h // rep])
            assert asymmetry(q[:, h], k[:, h]) > 1e-2
    after = capture(hf, 1, ids)
    assert all(torch.equal(after[n][1], before[n][1]) for n in before)  # restored bit for bit


def _equal_gains(folder, out):
    """The same model with every layer's key-norm gain set to its query-norm gain (saved to `out`)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.k_norm.weight.copy_(layer.self_attn.q_norm.weight)
    model.save_pretrained(out)
    return tiny.save_tokenizer(out)


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_rotary_scores_are_symmetric_at_every_offset_where_the_gains_agree(folders, tmp_path, family):
    """With g_q = g_k (on every rotated pair g_q/g_k constant is enough), one matrix through the norms gives
    scores symmetric at every pair of positions, through the model's own rotary embedding; with the model's own
    unequal gains, only the unrotated form is (the test above)."""
    name = "gemma3" if family == "gemma3" else "qwen3"
    rotate = importlib.import_module(f"transformers.models.{name}.modeling_{name}").apply_rotary_pos_emb
    ids = torch.arange(5, 5 + T)[None]
    results = {}
    for label, folder in (("equal", _equal_gains(folders[family], tmp_path / "eq")), ("own", folders[family])):
        hf, layers = opened(folder)
        L = apply_edit(layers[1], parse_edit("share_qk"), heads=[1, 2]).layer
        with written(hf, [L]):
            got = capture(hf, 1, ids)
        q, k = normed_qk(got, L.spec.d_head)
        q, k = (t.transpose(0, 1)[None] for t in (q, k))  # (1, H, T, d)
        kinds = getattr(hf.model.config, "layer_types", None)  # Gemma 3: one rotary embedding per layer kind
        kw = {"layer_type": kinds[1]} if family == "gemma3" else {}
        cos, sin = hf.model.model.rotary_emb(q.float(), torch.arange(T)[None], **kw)
        q, k = rotate(q, k, cos.double(), sin.double())
        S = (q @ k.mT)[0]  # (H, T, T): query at position i against key at j, before the mask
        results[label] = [float((S[h] - S[h].T).abs().max() / S[h].abs().max()) for h in (1, 2)]
    assert max(results["equal"]) < 1e-5, results
    assert min(results["own"]) > 1e-3, results  # random gains differ within pairs


@pytest.mark.parametrize("family", FAMILIES)
def test_rank_bounds_the_normalised_queries(models, family):
    """rank:K through the norms: the edited head's normalised queries span at most K dimensions (K + 1 with a query
    bias: the bias is kept), whatever the rotation does to them afterwards; keys unchanged bit for bit."""
    hf, layers = models[family]
    ids = torch.arange(5, 5 + T)[None]
    L0 = layers[1]
    d, K = L0.spec.d_head, 4
    before = capture(hf, 1, ids)
    q0, k0 = normed_qk(before, d)
    heads = heads_for(family)
    L = apply_edit(L0, parse_edit(f"rank:{K}"), heads=heads).layer
    with written(hf, [L]):
        q, k = normed_qk(capture(hf, 1, ids), d)
    assert torch.equal(k, k0)
    bound = K + (L0.b_Q is not None)
    for h in heads:
        sv = torch.linalg.svdvals(q[:, h])
        assert sv[bound:].max() < 1e-5 * sv[0], (h, sv)
        assert torch.linalg.svdvals(q0[:, h])[bound] > 1e-3 * sv[0]  # the unedited queries did not
    if family != "olmo2":
        assert torch.equal(q[:, 0], q0[:, 0]) and torch.equal(q[:, 3], q0[:, 3])


# -- refusals ---------------------------------------------------------------------------------------------------


def test_what_the_norms_cannot_define_is_refused_in_one_line(folders):
    for e in ("share_qk", "symmetric", "share_qkv", "rank:2"):
        with pytest.raises(EditError, match="every head of the layer together") as err:
            run_experiment(folders["olmo2"], e, layers=[0], heads=[0], tokens=64, window=32)
        assert "\n" not in str(err.value)
    with pytest.raises(EditError, match="every head of the layer together"):
        run_experiment(folders["olmo2"], "share_qk", layers=[0], tokens=64, window=32, estimate=True, probes=2)
    layer = normed_layer(3)
    ln = replace(layer, extra={**layer.extra, "qk_norm_kind": "layernorm"})
    with pytest.raises(EditError, match="RMSNorm q/k norms only"):
        apply_edit(ln, parse_edit("share_qk"))
    with pytest.raises(EditError, match="query bias and a key bias or neither"):
        apply_edit(replace(layer, b_K=None), parse_edit("symmetric"))
    with pytest.raises(EditError, match="both norms' gains"):
        apply_edit(replace(layer, k_norm=None), parse_edit("rank:1"))
    for e in ("tie_q", "tie_k", "ablate"):  # literal: defined whatever the norms
        assert apply_edit(ln, parse_edit(e)).predicted


def test_runs_of_every_defined_edit_on_a_qk_norm_model(folders):
    r = run_experiment(folders["qwen3"], "share_qk,symmetric,rank:4,share_qkv", layers=[1], heads=[0, 3],
                       tokens=64, window=32)
    assert {x.edit for x in r.runs} == {"share_qk", "symmetric", "rank:4", "share_qkv", "ablate"}
    assert all(np.isfinite(x.dloss) for x in r.runs)
    # W_V W_O edits move the loss measurably (>= 1.9e-3); the Q/K edits of a tiny random model move its mean loss
    # by float32's resolution (symmetric: 8e-7), so theirs is shown in weight space, where it is exact
    assert all(abs(x.dloss) > EFFECT for x in r.runs if x.edit in ("share_qkv", "ablate"))
    assert all(x.predicted > 1e-3 for x in r.runs if x.edit not in ("share_qkv", "ablate"))
    # the one-matrix edits of a rotary q/k-normed head are built on the unrotated form, and say so
    assert all(x.offset0 == (x.edit in ONE_MATRIX) for x in r.runs)
    assert all("folded form" in r.predictors[e] for e in ("share_qk", "symmetric", "rank:4", "share_qkv"))
    assert "folded" not in r.predictors["ablate"]
    olmo = run_experiment(folders["olmo2"], "share_qk", scope="layer", layers=[1], tokens=64, window=32)
    assert [x.edit for x in olmo.runs] == ["share_qk", "ablate"]


# -- the estimate and healing on these families -------------------------------------------------------------------


@pytest.mark.parametrize(("family", "edit"), [("qwen3", "share_qk"), ("gemma3", "symmetric"),
                                              ("qwen3_moe", "rank:2")])
def test_the_estimate_on_qk_norm_families(folders, family, edit):
    """The estimate's first-order term is the loss's directional derivative along each head's Δo_h, and the
    all-heads rerun gives each head's own change (per-head norms: a head's output depends on its weights only),
    the same tests as for the other families (tests/experiment/test_estimate.py)."""
    from tests.experiment import test_estimate as te

    te.test_first_order_term_is_the_directional_derivative({family: folders[family]}, family, edit)
    te.test_the_all_heads_rerun_gives_each_heads_own_change({family: folders[family]}, family, edit)


def test_estimate_against_exact_runs_on_a_qk_norm_model(folders):
    r = run_experiment(folders["qwen3"], "share_qk", layers=[0, 1], tokens=128, window=32, estimate=True,
                       probes=8, verify=8, reference=False)
    checked = [x for x in r.runs if x.dloss is not None]
    assert len(checked) == 8 and all(x.dloss_estimate is not None for x in r.runs)
    est = np.array([x.dloss_estimate for x in checked])
    exact = np.array([x.dloss for x in checked])
    # a quadratic model of the loss on small random-model edits: same sign and size, not a rank test (n = 8)
    assert np.corrcoef(est, exact)[0, 1] > 0.8, (est, exact)


@pytest.mark.parametrize("edit", ["share_qk", "symmetric", "rank:3"])
def test_healing_keeps_the_edit_through_the_norms_at_every_step(folders, edit, monkeypatch):
    """Healing a q/k-normed layer: at every step, as the model's modules hold them, share_qk's query and key
    projections (biases included) are one, symmetric's differ by column signs only (so the norms see one RMS and
    the scores stay symmetric whatever the gains become), and rank:K's folded form W_Q diag(g_q g_k) W_Kᵀ has rank
    <= K with the norms' gains of that step."""
    from qkinspect.experiment import heal as heal_mod
    from qkinspect.experiment.heal import HealOptions
    from tests.experiment.test_heal import _text

    seen = []
    original_train = heal_mod.Healer.train

    def train(self, on_step=None, *args):
        def hook(model, step):
            if self.forms:
                a = model.model.layers[1].self_attn
                seen.append((step, *(t.detach().double().clone() for t in (
                    a.q_proj.weight, a.q_proj.bias, a.k_proj.weight, a.k_proj.bias, a.q_norm.weight,
                    a.k_norm.weight))))
            if on_step is not None:
                on_step(model, step)

        return original_train(self, hook, *args)

    monkeypatch.setattr(heal_mod.Healer, "train", train)
    opts = HealOptions(steps=3, lr=3e-2, batch_tokens=64, text=_text())
    r = run_experiment(str(folders["qwen3"]), edit, scope="layer", layers=[1], heads=[0, 2], tokens=96, window=32,
                       reference=False, heal=opts)
    assert r.healing.runs[0].violation < 1e-6
    assert [s for s, *_ in seen] == [0, 1, 2, 3]
    d = 12
    for step, wq, bq, wk, bk, gq, gk in seen:
        Wq, Wk = wq.view(-1, d, wq.shape[1]), wk.view(-1, d, wk.shape[1])  # (heads, d, D)
        Bq, Bk = bq.view(-1, d), bk.view(-1, d)
        rep = Wq.shape[0] // Wk.shape[0]  # 1 once the edit gave the heads keys of their own
        for h in (0, 2):
            g = h // rep
            q, k = torch.cat([Wq[h], Bq[h, :, None]], 1), torch.cat([Wk[g], Bk[g, :, None]], 1)
            if edit == "share_qk":
                assert torch.equal(q, k), (step, h)
            elif edit == "symmetric":
                s = torch.sign((q * k).sum(1, keepdim=True))
                assert (k - q * s).abs().max() <= 1e-6 * q.abs().max(), (step, h)
            else:
                F = Wq[h].T @ torch.diag(gq * gk) @ Wk[g]  # (D, D) folded weight form
                sv = torch.linalg.svdvals(F)
                assert sv[3:].max() <= 1e-5 * sv[0], (step, h, sv)
    assert not torch.equal(seen[-1][1], seen[0][1])  # healing trained the edited heads
