"""The Grams decomposed in a background thread while the main thread forms the next products
(`heads._decompose_meanwhile`) give the values of the sequential order, bit for bit, for every head metric, shape
and selection; and the background thread is used only where it can help (CPU, two or more torch threads)."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qkinspect.metrics.heads as heads
from qkinspect.layer import AttentionLayer, BlockSpec
from qkinspect.metrics.heads import HEAD_METRICS, measure_products
from qkinspect.metrics.products import HeadProducts
from qkinspect.metrics.registry import resolve_metrics

DEFAULT = [n for n in resolve_metrics(None) if n in HEAD_METRICS]
ALL = list(HEAD_METRICS)


def _layer(seed: int, H: int, G: int, D: int, d: int, Dk: int | None = None, dv: int | None = None,
           shared: bool = False, poison: bool = False) -> AttentionLayer:
    g = torch.Generator().manual_seed(seed)
    Dk, dv = Dk or D, dv or d
    spec = BlockSpec(name="decoder", n_layers=1, n_heads=H, n_kv_heads=G, d_model=D, d_head=d,
                     d_model_kv=None if Dk == D else Dk, d_head_v=None if dv == d else dv)
    W_Q = torch.randn(H, D, d, generator=g, dtype=torch.float32)
    W_K = W_Q if shared else torch.randn(G, Dk, d, generator=g, dtype=torch.float32)
    W_V = torch.randn(G, Dk, dv, generator=g, dtype=torch.float32)
    W_O = torch.randn(H, dv, D, generator=g, dtype=torch.float32)
    if poison:  # a non-finite query head and a zero KV head
        W_Q[0, 0, 0] = float("nan")
        W_K[G - 1] = 0
    return AttentionLayer(spec=spec, layer=0, W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O)


def _both(layer: AttentionLayer, names: list[str], heads_sel=None, spectra=("qk",)):
    """measure_products with the background decompositions, and without them (the sequential order)."""
    with mock.patch.object(torch, "get_num_threads", return_value=max(2, torch.get_num_threads())):
        overlapped = measure_products(HeadProducts(layer, heads_sel), names, spectra)
    with mock.patch.object(heads, "_decompose_meanwhile", lambda p, names: None):
        sequential = measure_products(HeadProducts(layer, heads_sel), names, spectra)
    return overlapped, sequential


def _assert_identical(a, b) -> None:
    (va, sa, na), (vb, sb, nb) = a, b
    assert va.keys() == vb.keys()
    for k in va:
        np.testing.assert_array_equal(va[k], vb[k], err_msg=k)  # NaN == NaN here; bit for bit otherwise
    assert sa.keys() == sb.keys()
    for k in sa:
        for x, y in zip(sa[k], sb[k], strict=True):
            np.testing.assert_array_equal(x, y, err_msg=k)
    for k in na.ranks:
        np.testing.assert_array_equal(na.ranks[k], nb.ranks[k])
    np.testing.assert_array_equal(na.recomputed, nb.recomputed)


@pytest.mark.parametrize("names", [DEFAULT, ALL, ["symmetry"], ["overlap_kv"], ["cka_qv", "directionality"]],
                         ids=["default", "all", "symmetry", "overlap_kv", "cka_qv+directionality"])
@pytest.mark.parametrize("shape", [
    dict(H=4, G=4, D=48, d=8),  # MHA
    dict(H=6, G=2, D=40, d=8),  # GQA
    dict(H=4, G=4, D=32, d=8, shared=True),  # one matrix for queries and keys
    dict(H=4, G=2, D=40, d=8, Dk=24, dv=6),  # cross-attention: D != Dk, d_head_v != d_head
    dict(H=4, G=2, D=40, d=8, poison=True),  # a non-finite and a zero head
], ids=["mha", "gqa", "shared_qk", "cross", "poisoned"])
def test_background_decompositions_give_the_sequential_values(shape, names):
    _assert_identical(*_both(_layer(0, **shape), names))


def test_a_head_selection_is_the_same_too():
    _assert_identical(*_both(_layer(1, H=6, G=2, D=40, d=8), DEFAULT, heads_sel=torch.tensor([5, 0, 3])))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), G=st.integers(1, 3), rep=st.integers(1, 3), d=st.integers(2, 10),
       extra=st.integers(0, 30))
def test_background_decompositions_property(seed, G, rep, d, extra):
    """Any GQA shape, rows from d (square Grams, often ill-conditioned in float32: recomputed heads) upwards."""
    _assert_identical(*_both(_layer(seed, H=G * rep, G=G, D=d + extra, d=d), ALL))


def test_no_background_thread_on_one_torch_thread():
    p = HeadProducts(_layer(2, H=4, G=4, D=48, d=8))
    with mock.patch.object(torch, "get_num_threads", return_value=1), \
            mock.patch.object(heads, "_decompose") as decompose:
        measure_products(p, DEFAULT)
    decompose.assert_not_called()
