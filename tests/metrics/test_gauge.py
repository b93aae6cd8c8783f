"""Gauge invariance, metric by metric, as the registry declares it.

W_Q -> W_Q G, W_K -> W_K G⁻ᵀ (one G per KV group) leaves every attention score unchanged; W_V -> W_V G',
W_O -> G'⁻¹ W_O leaves every head output unchanged. "yes" metrics must not move under any such G, "orthogonal"
ones only under orthogonal G, and the basis-dependent ones must be seen to move.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from qkinspect.metrics.heads import measure_heads
from qkinspect.metrics.layer_form import head_overlap, layer_form_metrics
from qkinspect.metrics.products import HeadProducts
from qkinspect.metrics.registry import HEAD_METRIC_NAMES, METRICS
from tests.metrics.helpers import make_layer


def _basis_change(rng: np.random.Generator, n: int, orthogonal: bool) -> torch.Tensor:
    """A random orthogonal matrix, or a well-conditioned invertible one (singular values in [0.5, 2])."""
    q1, _ = np.linalg.qr(rng.standard_normal((n, n)))
    if orthogonal:
        return torch.tensor(q1)
    q2, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return torch.tensor(q1 @ np.diag(rng.uniform(0.5, 2.0, n)) @ q2)


def regauge(layer, seed: int, orthogonal: bool):
    rng = np.random.default_rng(seed)
    s = layer.spec
    Gq = torch.stack([_basis_change(rng, s.d_head, orthogonal) for _ in range(s.n_kv_heads)])  # (G, d, d)
    Gv = torch.stack([_basis_change(rng, s.v_head, orthogonal) for _ in range(s.n_kv_heads)])  # (G, dv, dv)
    Gk = torch.linalg.inv(Gq).mT  # G⁻ᵀ
    kv = layer.kv_index()
    return replace(layer, W_Q=layer.W_Q @ Gq[kv], W_K=layer.W_K @ Gk, b_Q=(layer.b_Q.unsqueeze(1) @ Gq[kv])[:, 0],
                   b_K=(layer.b_K.unsqueeze(1) @ Gk)[:, 0], W_V=layer.W_V @ Gv,
                   b_V=(layer.b_V.unsqueeze(1) @ Gv)[:, 0], W_O=torch.linalg.inv(Gv)[kv] @ layer.W_O)


def _values(layer):
    return measure_heads(layer, HEAD_METRIC_NAMES, dtype=torch.float64)[0]


def _scores(layer, x):
    """All heads' attention scores for inputs x (T, D): (H, T, T)."""
    q = torch.einsum("td,hde->hte", x, layer.W_Q) + layer.b_Q[:, None]
    k = torch.einsum("td,gde->gte", x, layer.W_K) + layer.b_K[:, None]
    return q @ k[layer.kv_index()].mT


@pytest.fixture(scope="module", params=[4, 5], ids=["dv=d", "dv!=d"])
def layer(request):
    return make_layer(11, H=6, G=3, D=16, d=4, dv=request.param)


def test_regauge_keeps_the_model(layer):
    """The transformation really is a gauge: bilinear scores x W_Q W_Kᵀ yᵀ and W_V W_O unchanged."""
    other = regauge(layer, 1, orthogonal=False)
    x = torch.randn(7, 16, dtype=torch.float64)
    M0 = layer.W_Q @ layer.W_K[layer.kv_index()].mT
    M1 = other.W_Q @ other.W_K[other.kv_index()].mT
    torch.testing.assert_close(M1, M0)
    OV0 = layer.W_V[layer.kv_index()] @ layer.W_O
    torch.testing.assert_close(other.W_V[other.kv_index()] @ other.W_O, OV0)
    assert _scores(other, x).shape == (6, 7, 7)


@pytest.mark.parametrize("orthogonal", [False, True])
def test_invariant_metrics_do_not_move(layer, orthogonal):
    want = {"yes"} | ({"orthogonal"} if orthogonal else set())
    before, after = _values(layer), _values(regauge(layer, 2, orthogonal))
    for name in HEAD_METRIC_NAMES:
        if METRICS[name].gauge_invariant in want:
            np.testing.assert_allclose(after[name], before[name], rtol=1e-8, atol=1e-10, err_msg=name)


def test_basis_dependent_metrics_move(layer):
    """Every metric not marked "yes" changes under a general re-basing; "no" ones even under an orthogonal one."""
    before = _values(layer)
    general, orth = _values(regauge(layer, 3, False)), _values(regauge(layer, 3, True))
    for name in HEAD_METRIC_NAMES:
        gauge = METRICS[name].gauge_invariant
        if np.isnan(before[name]).all():
            assert name.startswith("cosine") and layer.spec.v_head != layer.spec.d_head, name
            continue
        if gauge != "yes":
            assert np.abs(general[name] - before[name]).max() > 1e-6, name
        if gauge == "no":
            assert np.abs(orth[name] - before[name]).max() > 1e-6, name


def test_entrywise_cosine_changes_while_overlap_does_not(layer):
    before, after = _values(layer), _values(regauge(layer, 4, False))
    assert np.abs(after["cosine_qk"] - before["cosine_qk"]).max() > 1e-3
    np.testing.assert_allclose(after["overlap_qk"], before["overlap_qk"], rtol=1e-9)
    np.testing.assert_allclose(after["symmetry"], before["symmetry"], rtol=1e-9)


def test_layer_metrics_are_invariant(layer):
    other = regauge(layer, 5, False)
    p0, p1 = HeadProducts(layer, dtype=torch.float64), HeadProducts(other, dtype=torch.float64)
    a, b = layer_form_metrics(p0.Q, p0.K, p0.kv), layer_form_metrics(p1.Q, p1.K, p1.kv)
    for k in a:
        assert METRICS[k].gauge_invariant == "yes"
        assert b[k] == pytest.approx(a[k], rel=1e-9)
    assert METRICS["head_overlap"].gauge_invariant == "yes"
    torch.testing.assert_close(head_overlap(p1), head_overlap(p0), rtol=1e-9, atol=1e-12)
