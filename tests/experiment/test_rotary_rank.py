"""`rank:K` on rotary heads (docs/experiments.md, "Rotary heads and rank:K"): its definition checked densely at every
offset, its identities (nested, monotone, rank:d changes nothing), and the scores the written-back model computes
through transformers' own rotary embedding equal the definition's."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkinspect.experiment import apply_edit, parse_edit
from tests.metrics.helpers import make_layer

# Frequencies 2π f / N with f = 1, 3, 5, 7 and N = 32: no sum or difference of two (nor a double) is a multiple of
# N, so the mean over offsets 0..N−1 is exactly the long-run mean the gauge edits are defined by.
N, F = 32, np.array([1, 3, 5, 7])


def pairs(d: int, r: int, style: str) -> tuple[np.ndarray, np.ndarray]:
    m = np.arange(r // 2)
    return (m, m + r // 2) if style == "half" else (2 * m, 2 * m + 1)


def rotate(W: np.ndarray, t: int, r: int, style: str) -> np.ndarray:
    """The columns of W (D, d) as RoPE rotates them at position t: pair m by the angle 2π F[m] t / N."""
    a, b = pairs(W.shape[1], r, style)
    ang = 2 * np.pi * F[: r // 2] * t / N
    out = W.copy()
    out[:, a] = W[:, a] * np.cos(ang) - W[:, b] * np.sin(ang)
    out[:, b] = W[:, a] * np.sin(ang) + W[:, b] * np.cos(ang)
    return out


def forms(layer, h: int) -> np.ndarray:
    """M(t) = W_Q R_t W_Kᵀ for t = 0..N−1, (N, D, D): what the scores at offset t read."""
    s, style = layer.spec, layer.extra["rotary_style"]
    A, B = layer.W_Q[h].double().numpy(), layer.W_K[h // s.group_size].double().numpy()
    return np.stack([rotate(A, t, s.rotary_dims, style) @ B.T for t in range(N)])


def rotary(layer, r: int, style: str):
    return replace(layer, spec=replace(layer.spec, positional="rope", rotary_dims=r), extra={"rotary_style": style})


def change(new, old) -> float:
    return float(np.sqrt(((new - old) ** 2).sum() / (old**2).sum()))


def dropped_pairs(layer, h: int) -> set[int]:
    s = layer.spec
    a, b = pairs(s.d_head, s.rotary_dims, layer.extra["rotary_style"])
    W = layer.W_Q[h].double().numpy()
    return {m for m in range(len(a)) if not W[:, a[m]].any() and not W[:, b[m]].any()}


heads = st.tuples(st.integers(0, 10_000), st.sampled_from([(4, 4), (6, 6), (8, 8), (6, 4), (8, 4), (8, 2)]),
                  st.sampled_from(["half", "interleaved"]))


@settings(max_examples=30, deadline=None)
@given(heads)
def test_rank_is_monotone_and_full_rank_changes_nothing(args):
    """The form's change over all offsets never grows with K, is 0 at K = d and 1 at K = 0, and is the predicted
    figure; on fully rotary heads the dropped pairs are nested (rank:K−2 drops all that rank:K drops) and an odd K
    keeps what K−1 keeps (a pair is kept whole or not at all)."""
    seed, (d, r), style = args
    layer = rotary(make_layer(seed, H=2, G=1, D=9, d=d), r, style)
    for h in range(2):
        old = forms(layer, h)
        runs = [apply_edit(layer, parse_edit(f"rank:{K}")) for K in range(d + 1)]
        got = [change(forms(res.layer, h), old) for res in runs]
        assert got[d] < 1e-9 and got[0] == pytest.approx(1, abs=1e-12)
        assert all(b <= a + 1e-9 for a, b in zip(got, got[1:], strict=False)), got
        np.testing.assert_allclose([res.predicted[h] for res in runs], got, atol=1e-9)
        if r == d:
            drops = [dropped_pairs(res.layer, h) for res in runs]
            assert all(drops[K] >= drops[K + 1] for K in range(d)), drops
            assert all(drops[K] == drops[K - 1] for K in range(1, d + 1, 2))


def test_partial_rotary_drops_need_not_nest():
    """With unrotated dims beside the pairs the best choice can trade two real directions for one pair, so the
    kept sets of K and K+1 need not nest (the change is still monotone): real σ² = 10, 1 and two pairs of 6.
    rank:2 keeps both real directions (11 > 6), rank:3 one pair and the first direction (16 > 11)."""
    from qkinspect.experiment.edits.apply import _budget

    s2 = torch.tensor([[10.0, 1.0]], dtype=torch.float64)
    w = torch.tensor([[6.0, 6.0]], dtype=torch.float64)
    assert [tuple(int(x) for x in _budget(s2, w, K)) for K in (2, 3, 4)] == [(0, 2), (1, 1), (1, 2)]


# -- through transformers: the written-back model's scores are the definition's ---------------------------------


def _attention_inputs(hf, layer: int, ids):
    """The input of layer `layer`'s q_proj and the projections q, k (public submodules, forward hooks)."""
    attn = hf.layers[layer].self_attn
    got = {}
    hooks = [attn.q_proj.register_forward_hook(lambda m, a, out: got.update(x=a[0], q=out)),
             attn.k_proj.register_forward_hook(lambda m, a, out: got.update(k=out))]
    try:
        with torch.inference_mode():
            hf.model(input_ids=ids, use_cache=False)
    finally:
        for hk in hooks:
            hk.remove()
    return got["x"][0].double(), got["q"][0].double(), got["k"][0].double()


@pytest.mark.parametrize("K", [0, 6, 10, 16])
def test_written_back_rank_scores_are_the_kept_pairs(tmp_path, K):
    """rank:K written into a tiny Llama (head_dim 16: 8 pairs, rotate_half): the scores q_i·k_j the model computes
    (its own q_proj/k_proj outputs, rotated by its own rotary embedding) equal, at every offset, the scores of the
    unedited head summed over the K/2 pairs with most ½|u|²|v|² (u, v: the pair's query and key columns as complex
    vectors) and nothing else."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    from qkinspect.experiment.model.runtime import load_hf
    from qkinspect.experiment.model.writeback import written
    from qkinspect.loading import open_model
    from tests.experiment import tiny_models as tiny

    folder = tiny.llama(tmp_path / "llama")
    with open_model(folder) as m:
        layer = m.layer("decoder", 1)
        hf = load_hf(m.resolved)
    s = layer.spec
    d, T, group = s.d_head, 24, s.group_size
    ids = torch.arange(5, 5 + T)[None]
    x, _, _ = _attention_inputs(hf, 1, ids)
    with written(hf, [apply_edit(layer, parse_edit(f"rank:{K}")).layer]):
        _, q, k = _attention_inputs(hf, 1, ids)
    cos, sin = hf.model.model.rotary_emb(q[None].float(), torch.arange(T)[None])
    theta = 10000.0 ** (-np.arange(0, d, 2) / d)  # the config's rope_theta, default rope
    ang = np.arange(T)[:, None] * theta[None]  # (T, d/2)
    for h in range(s.n_heads):
        qh = q[:, h * d:(h + 1) * d].reshape(1, 1, T, d)  # (T, H*d) -> (1, 1, T, d)
        kh = k[:, (h // group) * d:(h // group + 1) * d].reshape(1, 1, T, d)
        qr, kr = apply_rotary_pos_emb(qh, kh, cos.double(), sin.double())
        model_scores = (qr @ kr.mT)[0, 0].numpy()
        A, B = layer.W_Q[h].double().numpy(), layer.W_K[h // group].double().numpy()
        u, v = A[:, : d // 2] + 1j * A[:, d // 2:], B[:, : d // 2] + 1j * B[:, d // 2:]
        energy = 0.5 * (np.abs(u) ** 2).sum(0) * (np.abs(v) ** 2).sum(0)
        kept = np.argsort(-energy)[: K // 2]
        qa, ka = x.numpy() @ u, x.numpy() @ v  # (T, d/2): each pair as one complex coordinate
        rot = np.exp(1j * ang)
        want = np.zeros((T, T))
        for mm in kept:  # pair m's score: Re((q e^{iθi}) conj(k e^{iθj}))
            want += np.real(np.outer(qa[:, mm] * rot[:, mm], np.conj(ka[:, mm] * rot[:, mm])))
        scale = max(np.abs(model_scores).max(), 1e-30)
        np.testing.assert_allclose(model_scores, want, atol=1e-5 * scale, err_msg=f"head {h}")
