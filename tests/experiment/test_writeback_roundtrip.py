"""Each write-back is the inverse of the layout its adapter reads: layout by layout, the named reshape undoes its
inverse on any shapes (hypothesis), and family by family, a layer of new tensors written into the transformers model
is read back by qkinspect's own adapter (from the model in memory) as exactly those tensors."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkinspect.experiment.model.runtime import load_hf
from qkinspect.experiment.model.writeback import WRITERS, write_layer
from qkinspect.layer import AttentionLayer
from qkinspect.loading import open_model
from qkinspect.loading.adapters.base import heads_in, heads_out, out_rows_of_heads, rows_of_heads
from qkinspect.loading.adapters.fused import interleaved_per_head, sectioned, uninterleaved_per_head, unsectioned
from tests.experiment import tiny_models as tiny

dims = st.integers(1, 5)


@settings(max_examples=40, deadline=None)
@given(n=dims, D=dims, d=dims, seed=st.integers(0, 2**31 - 1))
def test_per_head_rows_and_their_inverse(n, D, d, seed):
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(n, D, d, generator=g)  # canonical (n, D, d)
    assert torch.equal(heads_in(rows_of_heads(W), n, d), W)
    W_O = torch.randn(n, d, D, generator=g)  # canonical (H, d, D)
    assert torch.equal(heads_out(out_rows_of_heads(W_O), n, d), W_O)


@settings(max_examples=40, deadline=None)
@given(H=dims, G=dims, d=dims, D=st.integers(0, 4), seed=st.integers(0, 2**31 - 1))
def test_fused_layouts_and_their_inverses(H, G, d, D, seed):
    g = torch.Generator().manual_seed(seed)
    tail = (D,) if D else ()  # a weight's rows (.., D) or a bias (rows,)
    q, k, v = (torch.randn(n, d, *tail, generator=g) for n in (H, G, G))
    assert all(torch.equal(a, b) for a, b in zip(sectioned(unsectioned(q, k, v), H, G, d), (q, k, v), strict=True))
    k, v = (torch.randn(H, d, *tail, generator=g) for _ in range(2))
    assert all(torch.equal(a, b) for a, b in
               zip(interleaved_per_head(uninterleaved_per_head(q, k, v), H, d), (q, k, v), strict=True))


MAKERS = {"llama": tiny.llama, "bert": tiny.bert, "gpt2": tiny.gpt2, "phi3": tiny.phi3, "gpt_neox": tiny.gpt_neox}


def test_every_writer_has_a_round_trip_here():
    assert set(MAKERS) == set(WRITERS)


def _fresh(layer: AttentionLayer, seed: int) -> AttentionLayer:
    """`layer` with every tensor replaced by new values of its shape and dtype (biases too, where it has them)."""
    g = torch.Generator().manual_seed(seed)
    new = {f.name: torch.randn(v.shape, generator=g).to(v.dtype) for f in fields(layer)
           if f.name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")
           and isinstance(v := getattr(layer, f.name), torch.Tensor)}
    return replace(layer, **new)


@pytest.mark.parametrize("family", sorted(MAKERS))
def test_what_is_written_is_read_back_by_the_adapter(family, tmp_path):
    with open_model(MAKERS[family](tmp_path / family)) as m:
        spec = m.info.blocks[0]
        layer = m.layer(spec.key, 1)
        hf = load_hf(m.resolved)
    assert hf.family == family
    want = _fresh(layer, seed=1)
    undo = write_layer(hf, want)
    try:
        with open_model(hf.model) as back:
            got = back.layer(back.info.blocks[0].key, 1)
    finally:
        undo()
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
        a, b = getattr(want, name), getattr(got, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert torch.equal(a, b.to(a.dtype)), f"{family} {name}"
