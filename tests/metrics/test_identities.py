"""Identities the metrics must satisfy exactly or statistically."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkinspect.layer import BlockSpec
from qkinspect.metrics.baseline import gaussian_baselines
from qkinspect.metrics.heads import measure_heads
from tests.metrics.helpers import make_layer

F64 = torch.float64


def _m(layer, names, **kw):
    return measure_heads(layer, names, dtype=kw.pop("dtype", F64), **kw)[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shared_qk_is_exactly_symmetric(dtype):
    """Reformer-style heads (W_K is W_Q) give s = 1 exactly, and Q-K overlap/CKA/cosine 1."""
    layer = make_layer(1, H=4, G=4, D=20, d=5)
    layer = replace(layer, W_K=layer.W_Q, b_K=None, spec=replace(layer.spec, shared_qk=True))
    v = _m(layer, ["symmetry", "overlap_qk", "cosine_qk", "cka_qk", "qk_eig_pos_frac", "directionality"],
           dtype=dtype)
    assert (v["symmetry"] == 1.0).all(), v["symmetry"]
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for name in ("overlap_qk", "cosine_qk", "cka_qk", "qk_eig_pos_frac"):
        np.testing.assert_allclose(v[name], 1.0, rtol=tol, err_msg=name)
    np.testing.assert_allclose(v["directionality"], 0.0, atol=tol)  # rows and columns of a symmetric M agree


def test_gqa_pairs_query_head_with_its_group():
    """W_Q[h] = W_K[h // rep]: every head symmetric. Tiling (h % G) would pair the wrong heads."""
    layer = make_layer(2, H=6, G=2, D=16, d=4)
    layer = replace(layer, W_Q=layer.W_K[torch.arange(6) // 3].clone())
    np.testing.assert_allclose(_m(layer, ["symmetry"])["symmetry"], 1.0, rtol=1e-12)
    tiled = replace(layer, W_Q=layer.W_K[torch.arange(6) % 2].clone())
    assert np.abs(_m(tiled, ["symmetry"])["symmetry"] - 1).max() > 0.1


def test_skew_form_has_symmetry_minus_one():
    """W_Q = [X, Y], W_K = [Y, -X] gives M = X Yᵀ - Y Xᵀ: skew-symmetric, purely imaginary eigenvalues."""
    layer = make_layer(3, H=3, G=3, D=14, d=6)
    X, Y = layer.W_Q[..., :3], layer.W_Q[..., 3:]
    layer = replace(layer, W_K=torch.cat([Y, -X], -1))
    v = _m(layer, ["symmetry", "qk_eig_pos_frac", "qk_eig_real_ratio", "cosine_qk"])
    np.testing.assert_allclose(v["symmetry"], -1.0, rtol=1e-12)
    np.testing.assert_allclose(v["qk_eig_real_ratio"], 0.0, atol=1e-12)
    np.testing.assert_allclose(v["qk_eig_pos_frac"], 0.0)


def test_random_baseline_is_near_zero():
    spec = BlockSpec("encoder", n_layers=1, n_heads=12, n_kv_heads=12, d_model=768, d_head=64)
    b = {x.metric: x for x in gaussian_baselines(spec, ["symmetry", "overlap_qk"], dtype=F64)}
    sym, ov = b["symmetry"], b["overlap_qk"]
    assert sym.n == 32 and sym.block == "encoder"
    assert abs(sym.mean) < 4 * sym.std / np.sqrt(sym.n) + 1e-4
    assert sym.std < 0.01
    assert ov.mean == pytest.approx(64 / 768, rel=0.05)  # random d-dim subspaces of R^D: E cos² = d/D


def test_baseline_is_deterministic_and_follows_shapes():
    spec = BlockSpec("decoder", n_layers=1, n_heads=4, n_kv_heads=2, d_model=64, d_head=8, label="text")
    a = gaussian_baselines(spec, ["symmetry", "overlap_kv"])
    assert a == gaussian_baselines(spec, ["symmetry", "overlap_kv"])
    assert [x.block for x in a] == ["text", "text"]
    cross = replace(spec, d_model_kv=32)
    names = [x.metric for x in gaussian_baselines(cross, ["symmetry", "overlap_qk", "overlap_kv"])]
    assert names == ["overlap_kv"]  # Q-vs-K statistics are undefined across different widths


def test_directionality_sign_follows_dominant_side():
    """One key direction read by every query: a dominant column, negative; one dominant query row: positive."""
    layer = make_layer(4, H=2, G=2, D=30, d=4)
    K = layer.W_K.clone()
    K[:, 7] *= 25
    col = _m(replace(layer, W_K=K), ["directionality"])["directionality"]
    Q = layer.W_Q.clone()
    Q[:, 7] *= 25
    row = _m(replace(layer, W_Q=Q), ["directionality"])["directionality"]
    assert (col < -0.5).all() and (row > 0.5).all(), (col, row)


def test_zero_and_non_finite_heads_give_nan_and_warnings():
    layer = make_layer(5, H=3, G=3, D=10, d=3, k_ranks=[None, 0, None])
    Q = layer.W_Q.clone()
    Q[2, 0, 0] = float("nan")
    values, _, warnings = measure_heads(replace(layer, W_Q=Q), ["symmetry", "overlap_qk", "norm_k_fro"])
    assert np.isfinite(values["symmetry"][0])
    assert np.isnan(values["symmetry"][1:]).all() and np.isnan(values["overlap_qk"][1:]).all()
    assert values["norm_k_fro"][1] == 0.0 and np.isnan(values["norm_k_fro"][2])
    assert len(warnings) == 2 and "head 1: W_K is zero" in warnings[0] and "head 2: non-finite" in warnings[1]


def test_half_precision_is_cast_up():
    layer = make_layer(6, H=4, G=2, D=24, d=6, dtype=torch.bfloat16)
    ref = replace(layer, **{k: getattr(layer, k).double() for k in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V")})
    names = ["symmetry", "qk_effective_rank", "overlap_qk", "ov_copying"]
    got, want = _m(layer, names, dtype=torch.float32), _m(ref, names)
    for n in names:
        np.testing.assert_allclose(got[n], want[n], rtol=1e-4, err_msg=n)


def _spd(rng: np.random.Generator, H: int, d: int) -> torch.Tensor:
    """H random symmetric positive definite d x d matrices (eigenvalues >= 0.1)."""
    B = torch.tensor(rng.standard_normal((H, d, d)))
    return B @ B.mT + 0.1 * torch.eye(d, dtype=F64)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**16), st.sampled_from(["psd", "negative", "skew"]))
def test_shared_qk_distance_identities(seed, kind):
    """W_K = W_Q P with P symmetric positive definite makes M = W_Q P W_Qᵀ a form one shared matrix gives
    (W = W_Q P^½): distance 0. Its negative, and a skew-symmetric M, are as far as can be: distance 1."""
    rng = np.random.default_rng(seed)
    layer = make_layer(seed, H=3, G=3, D=int(rng.integers(8, 20)), d=int(rng.integers(2, 5)))
    d = layer.spec.d_head
    if kind == "skew":
        h = d // 2 if d % 2 == 0 else (d - 1) // 2
        X, Y = layer.W_Q[..., :h], layer.W_Q[..., h : 2 * h]
        W_K = torch.cat([Y, -X, torch.zeros_like(layer.W_Q[..., 2 * h :])], -1)  # M = X Yᵀ - Y Xᵀ
    else:
        W_K = (1 if kind == "psd" else -1) * layer.W_Q @ _spd(rng, 3, d)
    v = _m(replace(layer, W_K=W_K), ["shared_qk_distance", "symmetry"])
    want = 0.0 if kind == "psd" else 1.0
    np.testing.assert_allclose(v["shared_qk_distance"], want, atol=1e-9)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**16))
def test_shared_qk_distance_is_bounded_by_the_skew_part(seed):
    """||M - P||² >= ||M_skew||² = (1 - symmetry)/2 · ||M||² for every symmetric P."""
    layer = make_layer(seed, H=4, G=2, D=14, d=4)
    v = _m(layer, ["shared_qk_distance", "symmetry"])
    assert (v["shared_qk_distance"] >= np.sqrt((1 - v["symmetry"]) / 2) - 1e-12).all()
    assert (v["shared_qk_distance"] <= 1).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shared_qk_distance_of_shared_and_random_heads(dtype):
    """Exactly 0 where W_K is W_Q; about √(3/4) for Gaussian factors (half of ||M||² in the skew part, half of the
    rest in negative eigenvalues of the symmetric part)."""
    layer = make_layer(5, H=4, G=4, D=20, d=5)
    shared = replace(layer, W_K=layer.W_Q, b_K=None, spec=replace(layer.spec, shared_qk=True))
    assert (_m(shared, ["shared_qk_distance"], dtype=dtype)["shared_qk_distance"] == 0).all()
    wide = make_layer(6, H=16, G=16, D=512, d=16, with_o=False, biases=False)
    v = _m(wide, ["shared_qk_distance"], dtype=dtype)["shared_qk_distance"]
    assert abs(v.mean() - np.sqrt(0.75)) < 0.03, v


def test_shared_qk_distance_baseline_is_root_three_quarters():
    spec = BlockSpec("encoder", n_layers=1, n_heads=12, n_kv_heads=12, d_model=768, d_head=64)
    (b,) = gaussian_baselines(spec, ["shared_qk_distance"], dtype=F64)
    assert b.metric == "shared_qk_distance" and b.n == 32
    assert b.mean == pytest.approx(np.sqrt(0.75), abs=0.01) and b.std < 0.01
