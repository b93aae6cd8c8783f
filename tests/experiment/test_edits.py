"""The head edits against dense references (formed d_model x d_model matrices, numpy float64), their identities
(hypothesis), rotary heads at every offset, and the GQA expansion."""

from __future__ import annotations

import importlib
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkinspect.errors import QkinspectError
from qkinspect.experiment import EDITS, PREDICTORS, Edit, apply_edit, expand_kv, parse_edit
from qkinspect.metrics.products import HeadProducts
from qkinspect.metrics.symmetry import shared_qk_distance
from tests.metrics.helpers import _shared_qk_distance, make_layer

GAUGE_INVARIANT = ("share_qk", "symmetric", "rank:2", "share_qkv")


def _np(t):
    return t.double().numpy()


def heads_of(layer, h):
    """W_Q, W_K, W_V, b_Q, b_K of query head h (numpy), through its KV head."""
    g = h // layer.spec.group_size
    b = lambda t, i: np.zeros(layer.spec.d_head) if t is None else _np(t[i])  # noqa: E731
    return _np(layer.W_Q[h]), _np(layer.W_K[g]), _np(layer.W_V[g]), b(layer.b_Q, h), b(layer.b_K, g)


def form(layer, h):
    A, B, *_ = heads_of(layer, h)
    return A @ B.T


def ov_form(layer, h):
    return _np(layer.W_V[h // layer.spec.group_size]) @ _np(layer.W_O[h])


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def sym_eig(M):
    return np.linalg.eigh((M + M.T) / 2)


def ref_share_qk(M, d):
    lam, U = sym_eig(M)
    lam, U = lam[-d:].clip(min=0), U[:, -d:]
    return (U * lam) @ U.T


def ref_symmetric(M, d):
    lam, U = sym_eig(M)
    top = np.argsort(-np.abs(lam))[:d]
    return (U[:, top] * lam[top]) @ U[:, top].T


def ref_rank(M, K):
    U, s, Vt = np.linalg.svd(M)
    return (U[:, :K] * s[:K]) @ Vt[:K]


def key_bias_ref(Wk_new, Wk, bq):
    """The least-squares query bias: W_K' b' ≈ W_K b_Q (the key-side bias term, the only one softmax sees)."""
    return np.linalg.lstsq(Wk_new, Wk @ bq, rcond=None)[0]


@pytest.fixture
def layer():
    return make_layer(3, H=4, G=2, D=12, d=3)


# -- parsing ----------------------------------------------------------------------------------------------


def test_parse_edit():
    assert parse_edit("rank:8") == Edit("rank", 8)
    assert parse_edit(" share_qk ") == Edit("share_qk")
    assert [str(parse_edit(e if e != "rank" else "rank:2")) for e in EDITS][4] == "rank:2"
    assert set(PREDICTORS) == set(EDITS)
    for bad in ("rank", "rank:", "rank:x", "rank:-1", "share_qk:3", "shareqk", ""):
        with pytest.raises(QkinspectError, match="edit"):
            parse_edit(bad)


# -- dense references, edit by edit ------------------------------------------------------------------------


def test_share_qk_dense(layer):
    res = apply_edit(layer, parse_edit("share_qk"))
    new = res.layer
    assert new.spec.n_kv_heads == 4 and not res.offset0_only
    for h in range(4):
        M, M2 = form(layer, h), form(new, h)
        A2, B2, _, bq2, bk2 = heads_of(new, h)
        np.testing.assert_allclose(A2, B2, atol=1e-12)  # one matrix for queries and keys
        np.testing.assert_allclose(M2, ref_share_qk(M, 3), atol=1e-10)
        assert res.predicted[h] == pytest.approx(rel(M2, M), abs=1e-12)
        assert res.predicted[h] == pytest.approx(_shared_qk_distance(M), abs=1e-12)
        _, Bk, _, bq, _ = heads_of(layer, h)
        np.testing.assert_allclose(bq2, key_bias_ref(B2, Bk, bq), atol=1e-9)
        np.testing.assert_allclose(bk2, bq2, atol=1e-12)


def test_symmetric_dense(layer):
    res = apply_edit(layer, parse_edit("symmetric"))
    for h in range(4):
        M, M2 = form(layer, h), form(res.layer, h)
        np.testing.assert_allclose(M2, ref_symmetric(M, 3), atol=1e-10)
        assert res.predicted[h] == pytest.approx(rel(M2, M), abs=1e-12)
        A2, B2, _, bq2, bk2 = heads_of(res.layer, h)
        augmented = np.vstack([A2, bq2]) @ np.vstack([B2, bk2]).T  # the biases keep the form symmetric
        np.testing.assert_allclose(augmented, augmented.T, atol=1e-10)
        _, Bk, _, bq, _ = heads_of(layer, h)
        np.testing.assert_allclose(bq2, key_bias_ref(B2, Bk, bq), atol=1e-9)


@pytest.mark.parametrize("K", [0, 1, 2, 3])
def test_rank_dense(layer, K):
    res = apply_edit(layer, parse_edit(f"rank:{K}"))
    assert res.layer.spec.n_kv_heads == 2  # only the queries change: no expansion
    assert torch.equal(res.layer.W_K, layer.W_K) and torch.equal(res.layer.b_Q, layer.b_Q)
    for h in range(4):
        M, M2 = form(layer, h), form(res.layer, h)
        np.testing.assert_allclose(M2, ref_rank(M, K), atol=1e-10)
        want = 1.0 if K == 0 else rel(M2, M)
        assert res.predicted[h] == pytest.approx(want, abs=1e-9)


@pytest.mark.parametrize("which", ["q", "k"])
def test_tie_dense(layer, which):
    res = apply_edit(layer, parse_edit(f"tie_{which}"), heads=[1, 2])
    assert res.layer.spec.n_kv_heads == (4 if which == "q" else 2)
    for h in (1, 2):
        A, B, _, bq, bk = heads_of(layer, h)
        A2, B2, _, bq2, bk2 = heads_of(res.layer, h)
        W, b = (A, bq) if which == "q" else (B, bk)
        np.testing.assert_array_equal(A2, W)
        np.testing.assert_array_equal(B2, W)
        np.testing.assert_array_equal(bq2, b)
        np.testing.assert_array_equal(bk2, b)
        assert res.predicted[h] == pytest.approx(rel(W @ W.T, A @ B.T), rel=1e-9)
    for h in (0, 3):  # heads not edited: the same scores (through their copy of the KV head)
        np.testing.assert_array_equal(form(res.layer, h), form(layer, h))


def test_share_qkv_dense(layer):
    res = apply_edit(layer, parse_edit("share_qkv"), heads=[0, 3])
    for h in (0, 3):
        A, B, V, _, _ = heads_of(layer, h)
        A2, B2, V2, _, _ = heads_of(res.layer, h)
        O, O2 = _np(layer.W_O[h]), _np(res.layer.W_O[h])
        np.testing.assert_allclose(A2 @ B2.T, ref_share_qk(A @ B.T, 3), atol=1e-10)
        np.testing.assert_allclose(V2, A2, atol=1e-12)
        np.testing.assert_allclose(B2, A2, atol=1e-12)
        OV, OV2 = V @ O, V2 @ O2
        np.testing.assert_allclose(OV2, A2 @ np.linalg.pinv(A2) @ OV, atol=1e-9)  # projection onto span W
        qk, ov = res.details[h]["qk"], res.details[h]["ov"]
        assert qk == pytest.approx(_shared_qk_distance(A @ B.T), abs=1e-12)
        assert ov == pytest.approx(rel(OV2, OV), abs=1e-9)
        assert res.predicted[h] == pytest.approx(np.sqrt((qk**2 + ov**2) / 2), abs=1e-12)
        bv, bv2 = _np(layer.b_V[h // 2]), _np(res.layer.b_V[h])
        np.testing.assert_allclose(bv2, np.linalg.lstsq(O2.T, O.T @ bv, rcond=None)[0], atol=1e-9)


def test_ablate(layer):
    res = apply_edit(layer, parse_edit("ablate"), heads=[2])
    assert not res.layer.W_O[2].any()
    for name in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V"):
        assert torch.equal(getattr(res.layer, name), getattr(layer, name))
    assert torch.equal(res.layer.W_O[[0, 1, 3]], layer.W_O[[0, 1, 3]])
    assert res.predicted == {2: 1.0}


def test_no_biases_stay_absent():
    layer = make_layer(4, H=2, G=2, D=10, d=3, biases=False)
    for e in EDITS:
        new = apply_edit(layer, parse_edit("rank:1" if e == "rank" else e)).layer
        assert new.b_Q is None and new.b_K is None and new.b_V is None, e


def test_key_bias_never_created():
    """b_K only shifts a query's scores by a constant; where the checkpoint has none, no edit adds one."""
    layer = replace(make_layer(5, H=2, G=2, D=10, d=3), b_K=None)
    for e in ("share_qk", "tie_q", "symmetric", "share_qkv"):
        assert apply_edit(layer, parse_edit(e)).layer.b_K is None


# -- dtypes, mutation, errors ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dtype_kept(dtype):
    layer = make_layer(6, H=4, G=2, D=16, d=4, dtype=dtype)
    res = apply_edit(layer, parse_edit("rank:4"), heads=[1])
    assert res.layer.W_Q.dtype == dtype
    assert torch.equal(res.layer.W_Q[[0, 2, 3]], layer.W_Q[[0, 2, 3]])  # heads not edited: bit for bit
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(res.layer.W_Q[1].double(), layer.W_Q[1].double(), rtol=tol, atol=tol)
    assert res.predicted[1] < 1e-12
    for e in ("share_qk", "share_qkv", "ablate"):
        out = apply_edit(layer, parse_edit(e)).layer
        assert {t.dtype for t in (out.W_Q, out.W_K, out.W_V, out.W_O)} == {dtype}


def test_errors(layer):
    cross = make_layer(7, H=2, G=2, D=10, Dk=8, d=3)
    with pytest.raises(QkinspectError, match="same input"):
        apply_edit(cross, parse_edit("share_qk"))
    assert apply_edit(cross, parse_edit("rank:1")).predicted  # rank needs no square form
    normed = replace(layer, spec=replace(layer.spec, qk_norm=True), q_norm=torch.ones(3), k_norm=torch.ones(3))
    for e in ("share_qk", "symmetric", "rank:1", "share_qkv"):  # defined through the norms: test_qknorm_edits.py
        assert apply_edit(normed, parse_edit(e)).predicted
    with pytest.raises(QkinspectError, match="q/k norm"):
        apply_edit(replace(normed, k_norm=None), parse_edit("share_qk"))
    with pytest.raises(QkinspectError, match="W_O"):
        apply_edit(replace(layer, W_O=None), parse_edit("ablate"))
    with pytest.raises(QkinspectError, match="d_head"):
        apply_edit(layer, parse_edit("rank:4"))
    for heads in ([4], [-1], [0, 0], []):
        with pytest.raises(QkinspectError, match="heads"):
            apply_edit(layer, parse_edit("share_qk"), heads=heads)
    wide_v = make_layer(8, H=2, G=2, D=10, d=3, dv=4)
    with pytest.raises(QkinspectError, match="value heads"):
        apply_edit(wide_v, parse_edit("share_qkv"))
    W_Q = layer.W_Q.clone()
    W_Q[1, 0, 0] = float("nan")
    with pytest.raises(QkinspectError, match="non-finite"):
        apply_edit(replace(layer, W_Q=W_Q), parse_edit("share_qk"), heads=[1])
    assert apply_edit(replace(layer, W_Q=W_Q), parse_edit("share_qk"), heads=[0]).predicted  # other heads fine


# -- GQA: expanding K/V alone changes nothing --------------------------------------------------------------


def attention(layer, x):
    """Every head's scores (H, T, T) and the layer's output (T, D), plain softmax attention, numpy."""
    s = layer.spec
    outs, scores = [], []
    for h in range(s.n_heads):
        A, B, V, bq, bk = heads_of(layer, h)
        bv = 0 if layer.b_V is None else _np(layer.b_V[h // s.group_size])
        S = (x @ A + bq) @ (x @ B + bk).T * s.score_scale
        P = np.exp(S - S.max(-1, keepdims=True))
        P /= P.sum(-1, keepdims=True)
        scores.append(S)
        outs.append(P @ (x @ V + bv) @ _np(layer.W_O[h]))
    return np.stack(scores), np.sum(outs, 0)


@pytest.mark.parametrize("G", [1, 2, 4])
def test_expand_kv_changes_nothing(G):
    layer = make_layer(9, H=4, G=G, D=12, d=3)
    x = np.random.default_rng(0).standard_normal((7, 12))
    big = expand_kv(layer)
    assert big.spec.n_kv_heads == 4 and big.W_K.shape == (4, 12, 3) and big.b_V.shape == (4, 3)
    for before, after in zip(attention(layer, x), attention(big, x), strict=True):
        np.testing.assert_array_equal(before, after)
    assert expand_kv(big) is big


def test_edit_one_head_leaves_the_others(layer):
    """share_qk of head 0 in a GQA layer: K/V expanded, and heads 1..3 compute exactly what they did."""
    x = np.random.default_rng(1).standard_normal((6, 12))
    (S0, _), (S1, _) = attention(layer, x), attention(apply_edit(layer, parse_edit("share_qk"), [0]).layer, x)
    np.testing.assert_array_equal(S0[1:], S1[1:])
    assert not np.allclose(S0[0], S1[0])


# -- identities (hypothesis) -------------------------------------------------------------------------------

shapes = st.tuples(st.integers(0, 10_000), st.integers(2, 5), st.integers(6, 14))  # seed, d, D


def _gauge(rng, d):
    q1, _ = np.linalg.qr(rng.standard_normal((d, d)))
    q2, _ = np.linalg.qr(rng.standard_normal((d, d)))
    return torch.tensor(q1 @ np.diag(rng.uniform(0.5, 2.0, d)) @ q2)


def _regauge(layer, rng):
    """W_Q -> W_Q G, W_K -> W_K G⁻ᵀ per head (one G per head: H == G here), biases likewise."""
    G = torch.stack([_gauge(rng, layer.spec.d_head) for _ in range(layer.spec.n_heads)])
    Gt = torch.linalg.inv(G).mT
    return replace(layer, W_Q=layer.W_Q @ G, W_K=layer.W_K @ Gt, b_Q=(layer.b_Q.unsqueeze(1) @ G)[:, 0],
                   b_K=(layer.b_K.unsqueeze(1) @ Gt)[:, 0])


@settings(max_examples=25, deadline=None)
@given(shapes)
def test_share_qk_keeps_a_shared_form(args):
    """W_Q = W G, W_K = W G⁻ᵀ: M = W Wᵀ is already what one matrix gives; share_qk keeps it, predicted 0."""
    seed, d, D = args
    layer = make_layer(seed, H=2, G=2, D=D, d=d)
    shared = _regauge(replace(layer, W_K=layer.W_Q), np.random.default_rng(seed))
    res = apply_edit(shared, parse_edit("share_qk"))
    for h in range(2):
        np.testing.assert_allclose(form(res.layer, h), form(shared, h), atol=1e-9 * np.abs(form(shared, h)).max())
        assert res.predicted[h] < 1e-6


@settings(max_examples=25, deadline=None)
@given(shapes)
def test_identities(args):
    seed, d, D = args
    layer = make_layer(seed, H=2, G=1, D=D, d=d)
    full = apply_edit(layer, parse_edit(f"rank:{d}"))  # rank:d_head changes nothing
    torch.testing.assert_close(full.layer.W_Q, layer.W_Q, rtol=1e-9, atol=1e-9)
    assert max(full.predicted.values()) < 1e-7
    once = apply_edit(layer, parse_edit("symmetric")).layer  # symmetric of symmetric is itself
    twice = apply_edit(once, parse_edit("symmetric")).layer
    for h in range(2):
        np.testing.assert_allclose(form(twice, h), form(once, h), atol=1e-9 * np.abs(form(once, h)).max())
    shared = apply_edit(layer, parse_edit("share_qk")).layer  # share_qk of share_qk likewise
    again = apply_edit(shared, parse_edit("share_qk"))
    assert max(again.predicted.values()) < 1e-7
    want = shared_qk_distance(HeadProducts(layer, dtype=torch.float64))  # the metric is the predicted figure
    got = apply_edit(layer, parse_edit("share_qk")).predicted
    np.testing.assert_allclose([got[0], got[1]], want.numpy(), atol=1e-10)


@settings(max_examples=15, deadline=None)
@given(shapes, st.sampled_from([e for e in EDITS if e != "rank"] + ["rank:1"]))
def test_inputs_never_mutated(args, e):
    seed, d, D = args
    layer = make_layer(seed, H=4, G=2, D=D, d=d)
    before = {k: getattr(layer, k).clone() for k in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V")}
    extra = dict(layer.extra)
    apply_edit(layer, parse_edit(e), heads=[0, 3])
    for k, t in before.items():
        assert torch.equal(getattr(layer, k), t), k
    assert layer.extra == extra and layer.spec.n_kv_heads == 2


@settings(max_examples=20, deadline=None)
@given(shapes)
def test_gauge_invariance(args):
    """The edited form is a function of M alone for the invariant edits; tie_q depends on the basis."""
    seed, d, D = args
    layer = make_layer(seed, H=2, G=2, D=D, d=d)
    moved = _regauge(layer, np.random.default_rng(seed + 1))
    for e in GAUGE_INVARIANT:
        a, b = apply_edit(layer, parse_edit(e)).layer, apply_edit(moved, parse_edit(e)).layer
        for h in range(2):
            scale = np.abs(form(a, h)).max()
            np.testing.assert_allclose(form(b, h), form(a, h), atol=1e-8 * scale, err_msg=e)
            if e == "share_qkv":
                np.testing.assert_allclose(ov_form(b, h), ov_form(a, h), atol=1e-8 * np.abs(ov_form(a, h)).max())
    a, b = apply_edit(layer, parse_edit("tie_q")).layer, apply_edit(moved, parse_edit("tie_q")).layer
    assert rel(form(b, 0), form(a, 0)) > 1e-3


# -- rotary heads: the edits at every offset -----------------------------------------------------------------
# Frequencies θ_m = 2π f_m / N with f = 1, 3, 5: no sum or difference of two of them (nor 2θ_m) is a multiple of
# 2π, so the mean over the N offsets 0..N−1 is exactly the long-run mean over offsets the edits are defined by.
N = 32


def rope(W, t, r, style):
    """Hugging Face's rotary embedding of the rows of W (D, d) at position t: rotate_half ("half") or GPT-J's
    rotate_every_two ("interleaved") on the first r dims."""
    theta = 2 * np.pi * np.array([1, 3, 5])[: r // 2] / N * t
    x, rest = W[:, :r], W[:, r:]
    if style == "half":
        cos, sin = np.tile(np.cos(theta), 2), np.tile(np.sin(theta), 2)
        rot = np.concatenate([-x[:, r // 2:], x[:, : r // 2]], 1)
    else:
        cos, sin = np.repeat(np.cos(theta), 2), np.repeat(np.sin(theta), 2)
        rot = np.stack([-x[:, 1::2], x[:, ::2]], -1).reshape(x.shape)
    return np.concatenate([x * cos + rot * sin, rest], 1)


def offset_forms(layer, h):
    """M(t) = W_Q R_t W_Kᵀ for t = 0..N−1 (query t positions after the key), (N, D, D)."""
    A, B, *_ = heads_of(layer, h)
    r, style = layer.spec.rotary_dims, layer.extra["rotary_style"]
    return np.stack([rope(A, t, r, style) @ rope(B, 0, r, style).T for t in range(N)])


def rotary(layer, r, style):
    return replace(layer, spec=replace(layer.spec, positional="rope", rotary_dims=r),
                   extra={"rotary_style": style})


def mean_rel(new, old):
    """sqrt(mean_t ||M'(t) − M(t)||² / mean_t ||M(t)||²)."""
    return np.sqrt(((new - old) ** 2).sum() / (old**2).sum())


@pytest.fixture(params=[(4, "half"), (6, "interleaved"), (4, "interleaved")], ids=lambda p: f"{p[1]}-{p[0]}")
def rope_layer(request):
    r, style = request.param
    return rotary(make_layer(11, H=2, G=1, D=10, d=6), r, style)


@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_rope_reference_is_transformers(style):
    """The test's rotation is transformers' own: Llama's rotate_half, GPT-J's apply_rotary_pos_emb."""
    from transformers.models.gptj import modeling_gptj
    from transformers.models.llama import modeling_llama

    W = np.random.default_rng(2).standard_normal((5, 6))
    theta = torch.tensor(2 * np.pi * np.array([1, 3, 5]) / N * 7)
    x = torch.tensor(W)
    if style == "half":
        cos, sin = theta.cos().repeat(2), theta.sin().repeat(2)
        hf = x * cos + modeling_llama.rotate_half(x) * sin
    else:  # (batch, seq, heads, dim): the rows of W as a sequence
        hf = modeling_gptj.apply_rotary_pos_emb(x[None, :, None], theta.sin().expand(1, 5, 3),
                                                theta.cos().expand(1, 5, 3))[0, :, 0]
    np.testing.assert_allclose(rope(W, 7, 6, style), hf.numpy(), atol=1e-12)


def test_rope_reference_is_relative(rope_layer):
    """The test's rotation gives scores that depend on the offset alone, as RoPE's do."""
    A, B, *_ = heads_of(rope_layer, 0)
    r, style = rope_layer.spec.rotary_dims, rope_layer.extra["rotary_style"]
    np.testing.assert_allclose(rope(A, 7, r, style) @ rope(B, 4, r, style).T, offset_forms(rope_layer, 0)[3],
                               atol=1e-12)


@pytest.mark.parametrize("e", ["share_qk", "symmetric", "tie_q", "tie_k", "rank:1", "rank:2", "rank:3", "rank:4",
                               "share_qkv"])
def test_rope_predicted_is_the_offset_mean(rope_layer, e):
    """On rotary heads the predicted figure is the relative change of the scores' form over all offsets."""
    res = apply_edit(rope_layer, parse_edit(e))
    assert not res.offset0_only
    for h in range(2):
        got = res.details[h]["qk"] if e == "share_qkv" else res.predicted[h]
        assert got == pytest.approx(mean_rel(offset_forms(res.layer, h), offset_forms(rope_layer, h)), abs=1e-9)


def pair_blocks(layer, h):
    """A head as the blocks the rotary gauge keeps apart: the real block's M_0 and each pair's P = u vᴴ."""
    A, B, *_ = heads_of(layer, h)
    r, style = layer.spec.rotary_dims, layer.extra["rotary_style"]
    a = np.arange(r // 2) if style == "half" else 2 * np.arange(r // 2)
    b = a + r // 2 if style == "half" else a + 1
    u, v = A[:, a] + 1j * A[:, b], B[:, a] + 1j * B[:, b]
    return A[:, r:] @ B[:, r:].T, [np.outer(u[:, m], v[:, m].conj()) for m in range(r // 2)]


def hermitian_top(P, positive):
    lam, U = np.linalg.eigh((P + P.conj().T) / 2)
    i = -1 if positive else np.argmax(np.abs(lam))
    return max(lam[i], 0) * np.outer(U[:, i], U[:, i].conj()) if positive else lam[i] * np.outer(U[:, i],
                                                                                                 U[:, i].conj())


@pytest.mark.parametrize("e", ["share_qk", "symmetric"])
def test_rope_blocks_dense(rope_layer, e):
    """share_qk / symmetric of a rotary head: per block, the dense reference (real block as without rotary, each
    pair the Hermitian PSD / largest-modulus rank-1 part of u vᴴ); share_qk ties W_K = W_Q literally."""
    res = apply_edit(rope_layer, parse_edit(e))
    k0 = rope_layer.spec.d_head - rope_layer.spec.rotary_dims
    for h in range(2):
        (M0, Ps), (M0n, Psn) = pair_blocks(rope_layer, h), pair_blocks(res.layer, h)
        ref = ref_share_qk if e == "share_qk" else ref_symmetric
        np.testing.assert_allclose(M0n, ref(M0, k0) if k0 else 0 * M0, atol=1e-10)
        for P, Pn in zip(Ps, Psn, strict=True):
            np.testing.assert_allclose(Pn, hermitian_top(P, e == "share_qk"), atol=1e-10)
        if e == "share_qk":
            np.testing.assert_allclose(_np(res.layer.W_Q[h]), _np(res.layer.W_K[h]), atol=1e-12)
        forms = offset_forms(res.layer, h)  # token a at i vs b at j == b at j vs a at i: M'(t)ᵀ = M'(−t)
        np.testing.assert_allclose(forms.transpose(0, 2, 1), forms[(-np.arange(N)) % N], atol=1e-10)


@pytest.mark.parametrize("K", [0, 1, 2, 3, 4, 5, 6])
def test_rope_rank_is_the_best_pair_selection(rope_layer, K):
    """rank:K of a rotary head keeps whole pairs and real directions, the choice that keeps the most energy:
    checked against every subset of pairs."""
    from itertools import combinations

    res = apply_edit(rope_layer, parse_edit(f"rank:{K}"))
    for h in range(2):
        M0, Ps = pair_blocks(rope_layer, h)
        w = [np.linalg.norm(P) ** 2 / 2 for P in Ps]
        s2 = np.linalg.svd(M0, compute_uv=False) ** 2 if M0.size and M0.any() else np.zeros(0)
        best = max(sum(w[m] for m in S) + s2[: K - 2 * len(S)].sum()
                   for j in range(len(Ps) + 1) for S in combinations(range(len(Ps)), j) if 2 * j <= K)
        total = sum(w) + s2.sum()
        assert res.predicted[h] ** 2 == pytest.approx((total - best) / total, abs=1e-10)
    if K == 6:
        torch.testing.assert_close(res.layer.W_Q, rope_layer.W_Q, rtol=1e-10, atol=1e-10)


def _rope_gauge(layer, rng):
    """A re-basing that commutes with the rotation: any G on the unrotated dims, aI + bJ on each pair."""
    s = layer.spec
    d, r, style = s.d_head, s.rotary_dims, layer.extra["rotary_style"]
    G = np.zeros((d, d))
    G[r:, r:] = _gauge(rng, d - r).numpy() if d > r else 0
    for m in range(r // 2):
        i, j = (m, m + r // 2) if style == "half" else (2 * m, 2 * m + 1)
        a, b = rng.uniform(0.5, 2) * np.cos(c := rng.uniform(0, 6.3)), np.sin(c)
        G[np.ix_([i, j], [i, j])] = [[a, b], [-b, a]]
    G = torch.tensor(G)
    Gt = torch.linalg.inv(G).mT
    return replace(layer, W_Q=layer.W_Q @ G, W_K=layer.W_K @ Gt, b_Q=layer.b_Q @ G, b_K=layer.b_K @ Gt)


def test_rope_gauge_invariance(rope_layer):
    moved = _rope_gauge(rope_layer, np.random.default_rng(5))
    np.testing.assert_allclose(offset_forms(moved, 0), offset_forms(rope_layer, 0), atol=1e-10)  # a true gauge
    for e in GAUGE_INVARIANT:
        a, b = apply_edit(rope_layer, parse_edit(e)).layer, apply_edit(moved, parse_edit(e)).layer
        for h in range(2):
            np.testing.assert_allclose(offset_forms(b, h), offset_forms(a, h), atol=1e-9, err_msg=e)
    a, b = apply_edit(rope_layer, parse_edit("tie_q")).layer, apply_edit(moved, parse_edit("tie_q")).layer
    assert mean_rel(offset_forms(b, 0), offset_forms(a, 0)) > 1e-3


def test_rope_offset0_is_flagged(rope_layer):
    """rotary="offset0" edits the head as if it were not rotary: right at offset 0, flagged."""
    plain = replace(rope_layer, spec=replace(rope_layer.spec, positional="absolute"))
    for e in ("share_qk", "symmetric", "rank:3", "share_qkv"):
        res = apply_edit(rope_layer, parse_edit(e), rotary="offset0")
        assert res.offset0_only
        np.testing.assert_allclose(_np(res.layer.W_Q), _np(apply_edit(plain, parse_edit(e)).layer.W_Q), atol=1e-12)
    assert not apply_edit(rope_layer, parse_edit("tie_q"), rotary="offset0").offset0_only  # literal either way


def test_rope_layout_of_mla():
    """DeepSeek MLA rotates the last rotary_dims of each head (extra["mla"]["rotary_position"] == "last")."""
    from qkinspect.experiment.edits.rotary import rotary_layout

    layer = rotary(make_layer(12, H=2, G=2, D=10, d=6), 4, "interleaved")
    lay = rotary_layout(replace(layer, extra={**layer.extra, "mla": {"rotary_position": "last"}}))
    assert lay.real.tolist() == [0, 1] and lay.a.tolist() == [2, 4] and lay.b.tolist() == [3, 5]
    with pytest.raises(QkinspectError, match="rotary_style"):
        rotary_layout(replace(layer, extra={"rotary_style": "spiral"}))


def test_docs_define_every_edit():
    """docs/experiments.md's Edits section has a row for every edit and every predicted figure."""
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "experiments.md").read_text()
    section = text.split("## Edits", 1)[1].split("\n## ", 1)[0]
    for e in EDITS:
        assert f"| `{e if e != 'rank' else 'rank:K'}` |" in section, e


# -- rotary edits through transformers' own rotary modules --------------------------------------------------


def _tiny_rotary_model(family, folder):
    """A random 1-layer Llama (full rotary, GQA) or GPT-NeoX (half the dims rotated, biases), saved to `folder`."""
    import transformers as tf

    torch.manual_seed(0)
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if family == "llama":
        cfg = tf.LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                             head_dim=8, intermediate_size=40, vocab_size=50, rope_parameters=rope)
        model = tf.LlamaForCausalLM(cfg)
    else:
        cfg = tf.GPTNeoXConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=40,
                               vocab_size=50, rope_parameters={**rope, "partial_rotary_factor": 0.5})
        model = tf.GPTNeoXForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_()  # biases that matter
    model.save_pretrained(folder)
    return model.eval()


@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
def test_rotary_edits_through_transformers(family, tmp_path):
    """The edited weights, rotated by the model's own rotary embedding, give scores with S_ij = S_ji (token a at i
    scores b at j as b at j scores a at i) for share_qk and symmetric. This ties qkinspect's rotary layout (pairs,
    rotated dims, biases) to what the model computes."""
    from qkinspect.loading import open_model

    model = _tiny_rotary_model(family, tmp_path)
    with open_model(tmp_path) as m:
        layer = m.layer(m.info.blocks[0].key, 0, dtype=torch.float64)
    base = model.model if family == "llama" else model.gpt_neox
    rotate = importlib.import_module(f"transformers.models.{family}.modeling_{family}").apply_rotary_pos_emb
    x = torch.randn(1, 12, 32, dtype=torch.float64)
    cos, sin = (t.double() for t in base.rotary_emb(x.float(), torch.arange(12)[None]))

    def scores(lay, h):
        g = h // lay.spec.group_size
        q = x @ lay.W_Q[h] + (0 if lay.b_Q is None else lay.b_Q[h])  # (1, T, d)
        k = x @ lay.W_K[g] + (0 if lay.b_K is None else lay.b_K[g])
        q, k = rotate(q[:, None], k[:, None], cos, sin)  # (1, 1, T, d): the model's own rotation
        return (q @ k.mT)[0, 0].numpy()

    S = scores(layer, 0)
    assert rel(S.T, S) > 0.1
    for e in ("share_qk", "symmetric"):
        new = apply_edit(layer, parse_edit(e)).layer
        for h in range(4):
            S = scores(new, h)
            np.testing.assert_allclose(S.T, S, atol=1e-6 * np.abs(S).max(), err_msg=f"{e} head {h}")
