"""fold_ln and fold_qk_norm are exact rewrites of the computation, as pure functions."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from qkinspect.errors import InputError
from qkinspect.layer import Norm
from qkinspect.metrics.fold import fold_ln, fold_qk_norm
from tests.metrics.helpers import make_layer


def _layernorm(y: torch.Tensor) -> torch.Tensor:
    return (y - y.mean(-1, keepdim=True)) / y.std(-1, correction=0, keepdim=True)


def _project(x, W, b):
    return torch.einsum("td,hde->hte", x, W) + (0 if b is None else b[:, None])


@pytest.mark.parametrize("with_bias", [True, False])
def test_fold_ln_reproduces_projections(with_bias):
    layer = make_layer(1, H=4, G=2, D=12, d=3, biases=with_bias)
    g = torch.Generator().manual_seed(0)
    norm = Norm("layernorm", torch.rand(12, generator=g, dtype=torch.float64) + 0.5,
                torch.randn(12, generator=g, dtype=torch.float64) if with_bias else None)
    layer = replace(layer, norm_q=norm, norm_kv=norm)
    folded = fold_ln(layer)
    y = torch.randn(5, 12, generator=g, dtype=torch.float64)
    n = _layernorm(y)
    x = norm.gain * n + (norm.bias if norm.bias is not None else 0)
    for W, b in (("W_Q", "b_Q"), ("W_K", "b_K"), ("W_V", "b_V")):
        want = _project(x, getattr(layer, W), getattr(layer, b))
        got = _project(n, getattr(folded, W), getattr(folded, b))
        torch.testing.assert_close(got, want)
    assert folded.norm_q is None and layer.norm_q is norm  # input untouched


def test_fold_ln_rmsnorm_unit_offset_and_bf16():
    layer = make_layer(2, H=2, G=2, D=8, d=4, biases=False, dtype=torch.bfloat16)
    norm = Norm("rmsnorm", torch.full((8,), 0.5, dtype=torch.bfloat16), add_unit_offset=True)
    folded = fold_ln(replace(layer, norm_q=norm, norm_kv=norm))
    assert folded.W_Q.dtype == torch.float32
    torch.testing.assert_close(folded.W_Q, 1.5 * layer.W_Q.float())


def test_fold_ln_without_norm_is_an_input_error():
    with pytest.raises(InputError, match="no norm"):
        fold_ln(make_layer(3))


def test_fold_qk_norm_scales_scores_by_the_gains():
    layer = make_layer(4, H=4, G=2, D=10, d=3)
    gq = torch.rand(4, 3, dtype=torch.float64) + 0.5
    gk = torch.rand(3, dtype=torch.float64) + 0.5
    folded = fold_qk_norm(replace(layer, q_norm=gq, k_norm=gk))
    kv = layer.kv_index()
    want = layer.W_Q @ torch.diag_embed(gq * gk) @ layer.W_K[kv].mT  # W_Q diag(g_q g_k) W_Kᵀ
    torch.testing.assert_close(folded.W_Q @ folded.W_K[kv].mT, want)
    torch.testing.assert_close(folded.b_Q, layer.b_Q * gq)
    assert folded.q_norm is None


def test_fold_qk_norm_without_gains_is_an_input_error():
    with pytest.raises(InputError, match=r"cannot fold q/k-norm gains: .* layer 0 has none"):
        fold_qk_norm(make_layer(5))
