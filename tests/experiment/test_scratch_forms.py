"""The forms with no edit behind them (qkinspect.experiment.edits.scratch) against dense references, and their
identities (hypothesis)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from qkinspect.experiment.edits.scratch import bilinear_attention, reformer_attention, without_self

torch.set_num_threads(1)


def _dense_reformer(q, k, v, scaling):
    """Loops: keys unit-normalised, causal, self masked unless the only visible position."""
    B, H, T, d = q.shape
    out = torch.zeros(B, T, H, d, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                visible = [j for j in range(i + 1) if j != i] or [i]
                s = torch.stack([q[b, h, i] @ (k[b, h, j] / k[b, h, j].norm()) * scaling for j in visible])
                w = torch.softmax(s, 0)
                out[b, i, h] = sum(w[n] * v[b, h, j] for n, j in enumerate(visible))
    return out


def _module():
    m = nn.Module()
    m.eval()
    return m


def test_reformer_attention_is_the_dense_loop():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    got, _ = reformer_attention(_module(), q, k, v, None, scaling=0.5)
    assert torch.allclose(got, _dense_reformer(q, k, v, 0.5), atol=1e-12)


def test_bilinear_attention_is_the_dense_loop():
    g = torch.Generator().manual_seed(1)
    B, T, D, H, d = 2, 4, 6, 3, 2
    x = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    W = torch.randn(H, D, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, H, T, d, generator=g, dtype=torch.float64)
    m = _module()
    m.qk, m.qk_input = W, x
    got, _ = bilinear_attention(m, None, None, v, None, scaling=0.3)
    want = torch.zeros(B, T, H, d, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                s = torch.stack([x[b, i] @ W[h] @ x[b, j] * 0.3 for j in range(i + 1)])
                want[b, i, h] = torch.softmax(s, 0) @ v[b, h, : i + 1]
    assert torch.allclose(got, want, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(1, 3), st.floats(0.1, 10), st.integers(0, 2**31 - 1))
def test_reformer_identities(T, H, c, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, H, T, 4, generator=g, dtype=torch.float64) for _ in range(3))
    out, w = reformer_attention(_module(), q, k, v, None)
    assert torch.allclose(w.sum(-1), torch.ones(1, H, T, dtype=torch.float64))  # each row a distribution
    diag = w.diagonal(dim1=-2, dim2=-1)
    assert float(diag[..., 1:].abs().sum()) == 0.0 and float(diag[..., 0].min()) == 1.0
    again, _ = reformer_attention(_module(), q, k * c, v, None)  # unit keys: their length does not matter
    assert torch.allclose(out, again, atol=1e-10)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5), st.integers(1, 3), st.integers(0, 2**31 - 1))
def test_bilinear_of_a_product_is_standard_attention_without_positions(T, H, seed):
    """W = W_Q W_Kᵀ gives eager attention on q = x W_Q, k = x W_K (no rotary positions)."""
    g = torch.Generator().manual_seed(seed)
    D, d = 6, 2
    x = torch.randn(1, T, D, generator=g, dtype=torch.float64)
    Wq, Wk = (torch.randn(H, D, d, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(1, H, T, d, generator=g, dtype=torch.float64)
    m = _module()
    m.qk, m.qk_input = Wq @ Wk.transpose(-2, -1), x
    got, _ = bilinear_attention(m, None, None, v, None)
    q = torch.einsum("btd,hde->bhte", x, Wq)
    k = torch.einsum("btd,hde->bhte", x, Wk)
    s = (q @ k.transpose(-2, -1)) / math.sqrt(d)
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    want = (torch.softmax(s, -1) @ v).transpose(1, 2)
    assert torch.allclose(got, want, atol=1e-10)


def test_self_mask_keeps_a_lone_position():
    allowed = torch.tensor([[True, False, False], [False, True, False], [True, True, True]])[None, None]
    kept = without_self(allowed)[0, 0]
    assert kept.tolist() == [[True, False, False], [False, True, False], [True, True, False]]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_wq_identity_pins_the_query_weights(family):
    from qkinspect.experiment.edits.scratch import pin_query_identity
    from qkinspect.experiment.model.runtime import CAUSAL, HFModel
    from qkinspect.twin.model import config_for, standard_model
    from qkinspect.twin.request import Shape

    model = standard_model(config_for(Shape(family, 1, 8, 2, 4), 10), seed=0)
    held = pin_query_identity(HFModel(model, family, CAUSAL, None))
    assert held.violation() == 0.0
    attn = model.model.layers[0].self_attn if family == "llama" else model.transformer.h[0].attn
    if family == "llama":
        assert torch.equal(attn.q_proj.weight, torch.eye(8)) and held.pinned == 0
    else:
        assert torch.equal(attn.c_attn.weight[:, :8], torch.eye(8)) and held.pinned == 8 * 8 + 8
