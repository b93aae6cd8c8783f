"""Every head metric against a dense reference on the formed matrices, on random shapes (float64, 1e-5)."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkinspect.metrics.heads import HEAD_METRICS, measure_heads
from qkinspect.metrics.registry import HEAD_METRIC_NAMES
from tests.metrics.helpers import assert_close, dense_head, dense_layer_form, make_layer

ALL = list(HEAD_METRIC_NAMES)


@st.composite
def layers(draw, cross: bool = False):
    """Shapes with d_head * n_heads != d_model allowed, GQA/MQA, rank-deficient and zero heads."""
    G = draw(st.integers(1, 3))
    rep = draw(st.integers(1, 3))
    d = draw(st.integers(1, 6))
    D = draw(st.integers(max(d, 2), 20))
    Dk = draw(st.integers(max(d, 2), 20)) if cross else D
    dv = draw(st.sampled_from([d, max(1, d - 1), d + 2]))
    rank = st.one_of(st.none(), st.integers(0, d))
    q_ranks = draw(st.lists(rank, min_size=G * rep, max_size=G * rep))
    k_ranks = draw(st.lists(rank, min_size=G, max_size=G))
    seed = draw(st.integers(0, 2**32 - 1))
    with_o = draw(st.booleans())
    biases = draw(st.booleans())
    return make_layer(seed, H=G * rep, G=G, D=D, d=d, dv=dv, Dk=Dk, q_ranks=q_ranks, k_ranks=k_ranks,
                      with_o=with_o, biases=biases)


def check_layer(layer) -> None:
    values, _, _ = measure_heads(layer, ALL, dtype=torch.float64)
    for h in range(layer.spec.n_heads):
        want = dense_head(layer, h)
        for name in ALL:
            assert_close(values[name][h], want[name], what=f"head {h} {name}")


def test_table_covers_the_registry():
    assert list(HEAD_METRICS) == ALL


@settings(max_examples=60, deadline=None)
@given(layers())
def test_head_metrics_match_dense_reference(layer):
    check_layer(layer)


@settings(max_examples=25, deadline=None)
@given(layers(cross=True))
def test_cross_attention_widths(layer):
    """Different query and key/value widths: Q-vs-K/V metrics are NaN, the rest still match."""
    check_layer(layer)


@settings(max_examples=30, deadline=None)
@given(layers())
def test_layer_form_matches_dense_reference(layer):
    from qkinspect.metrics.layer_form import layer_form_metrics
    from qkinspect.metrics.products import HeadProducts

    p = HeadProducts(layer, dtype=torch.float64)
    got = layer_form_metrics(p.Q, p.K, p.kv)
    want = dense_layer_form(layer)
    for k, v in want.items():
        assert_close(got[k], v, what=k)


def test_head_selection_matches_all_heads():
    layer = make_layer(3, H=6, G=3, D=14, d=4)
    full, _, _ = measure_heads(layer, ALL, dtype=torch.float64)
    part, _, _ = measure_heads(layer, ALL, heads=[5, 1], dtype=torch.float64)
    for name in ALL:
        np.testing.assert_allclose(part[name], full[name][[5, 1]], rtol=1e-12, err_msg=name)


def test_spectra_match_dense_singular_values():
    layer = make_layer(5, H=2, G=1, D=10, d=4, dv=3)
    _, spectra, _ = measure_heads(layer, [], spectra=("qk", "qk_eig", "q", "k", "v", "ov", "ov_eig"),
                                  dtype=torch.float64)
    A, B, V, O = (t.double().numpy() for t in (layer.W_Q[1], layer.W_K[0], layer.W_V[0], layer.W_O[1]))
    M, OV = A @ B.T, V @ O
    svd = lambda X, k: np.linalg.svd(X, compute_uv=False)[:k]  # noqa: E731
    np.testing.assert_allclose(spectra["qk"][1], svd(M, 4), rtol=1e-8)
    np.testing.assert_allclose(spectra["q"][1], svd(A, 4), rtol=1e-8)
    np.testing.assert_allclose(spectra["k"][1], svd(B, 4), rtol=1e-8)
    np.testing.assert_allclose(spectra["v"][1], svd(V, 3), rtol=1e-8)
    np.testing.assert_allclose(spectra["ov"][1], svd(OV, 3), rtol=1e-8)
    lam = np.linalg.eigvals(M)
    top = lam[np.argsort(-np.abs(lam))][:4]
    np.testing.assert_allclose(np.sort_complex(spectra["qk_eig"][1]), np.sort_complex(top), rtol=1e-8, atol=1e-10)
    lam = np.linalg.eigvals(OV)
    top = lam[np.argsort(-np.abs(lam))][:3]
    np.testing.assert_allclose(np.sort_complex(spectra["ov_eig"][1]), np.sort_complex(top), rtol=1e-8, atol=1e-10)
