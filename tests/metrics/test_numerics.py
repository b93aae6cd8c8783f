"""The default float32 gives each metric's value on ill-conditioned heads: heads whose float32 Grams cannot resolve
them are detected and measured again in float64, one rank cut (σ <= RANK_RTOL · σ_max) holds in every precision,
and the result says what was done (rank_q/rank_k/rank_v, one warning line)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qkinspect.metrics.factored as factored
from qkinspect.layer import AttentionLayer, BlockSpec
from qkinspect.metrics.factored import RANK_RTOL, GramFactor
from qkinspect.metrics.heads import HEAD_METRICS, measure_heads
from tests.metrics.helpers import assert_close, dense_head

EVERY = list(HEAD_METRICS)
CUT_DECADE = np.log10(RANK_RTOL)  # -5


def agree(got: float, want: float) -> bool:
    """Within 1e-3 relative, absolute where |want| < 1e-2; or both NaN."""
    if np.isnan(got) or np.isnan(want):
        return bool(np.isnan(got) and np.isnan(want))
    return abs(got - want) <= 1e-3 * max(abs(want), 1e-2)


def prescribed(rng: np.random.Generator, rows: int, sigma: np.ndarray) -> np.ndarray:
    """A (rows, d) matrix with singular values `sigma` and random singular vectors."""
    U, _ = np.linalg.qr(rng.standard_normal((rows, sigma.size)))  # (rows, d) orthonormal columns
    W, _ = np.linalg.qr(rng.standard_normal((sigma.size, sigma.size)))
    return (U * sigma) @ W.T


def spectrum(rng: np.random.Generator, d: int, lowest: float) -> np.ndarray:
    """d singular values from 1 down to 10**lowest, log-spaced with jitter, none within 0.1 decade of the rank cut
    (a direction there is on one side of the cut or the other by rounding, in any precision)."""
    e = np.sort(rng.uniform(lowest, 0, d))[::-1]
    e[0] = 0.0
    e = np.where(np.abs(e - CUT_DECADE) < 0.1, CUT_DECADE + np.where(e > CUT_DECADE, 0.1, -0.1), e)
    return 10.0**e


def ill_layer(seed: int, D: int, d: int, lowest: float, H: int = 4, G: int = 2, mix: float = 0.5) -> AttentionLayer:
    """A GQA layer whose W_Q, W_K, W_V, W_O have singular values spread down to 10**lowest, stored in float32 (the
    weights both precisions read are the same numbers). W_K leans towards its group's first W_Q by `mix`, so the
    overlaps are not at chance."""
    rng = np.random.default_rng(seed)
    Q = [prescribed(rng, D, spectrum(rng, d, lowest)) for _ in range(H)]
    K = [(1 - mix) * prescribed(rng, D, spectrum(rng, d, lowest)) + mix * Q[g * (H // G)] for g in range(G)]
    V = [prescribed(rng, D, spectrum(rng, d, lowest)) for _ in range(G)]
    O = [prescribed(rng, D, spectrum(rng, d, lowest)).T for _ in range(H)]
    spec = BlockSpec(name="decoder", n_layers=1, n_heads=H, n_kv_heads=G, d_model=D, d_head=d)
    t = lambda a: torch.tensor(np.asarray(a), dtype=torch.float32)  # noqa: E731
    return AttentionLayer(spec=spec, layer=0, W_Q=t(Q), W_K=t(K), W_V=t(V), W_O=t(O))


def assert_precisions_agree(layer: AttentionLayer) -> tuple[dict, list[str]]:
    a, _, warnings = measure_heads(layer, EVERY, spectra=["q", "qk"], dtype=torch.float32)
    b, _, _ = measure_heads(layer, EVERY, spectra=["q", "qk"], dtype=torch.float64)
    for name in EVERY:
        for h, (x, y) in enumerate(zip(a[name], b[name], strict=True)):
            assert agree(x, y), f"{name} head {h}: float32 {x!r}, float64 {y!r}"
    for name in ("rank_q", "rank_k", "rank_v"):
        assert np.array_equal(a[name], b[name]), (name, a[name], b[name])
    return a, warnings


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), D=st.sampled_from([48, 256]), d=st.sampled_from([4, 8, 16]),
       lowest=st.floats(-6, 0), mix=st.floats(0, 0.9))
def test_float32_equals_float64_for_prescribed_spectra(seed, D, d, lowest, mix):
    """Every metric, every head, singular values from 1 down to 1e-6: the precision is not part of the result."""
    assert_precisions_agree(ill_layer(seed, D, d, lowest, mix=mix))


def test_ill_conditioned_heads_are_recomputed_and_said():
    """σ down to 1e-6 (below the cut) in every factor: the heads are recomputed, the ranks drop, one line says so."""
    layer = ill_layer(3, 256, 8, -6)
    values, warnings = assert_precisions_agree(layer)
    assert (values["rank_q"] < 8).any() and (values["rank_q"] > 0).all()
    lines = [w for w in warnings if "recomputed" in w or "rank cut" in w]
    assert len(lines) == 1
    assert lines[0].startswith("4 of 4 heads recomputed in float64") and "rank cut σ <= 1e-05 σ_max" in lines[0]


def test_well_conditioned_heads_keep_the_fast_route(monkeypatch):
    """Gaussian heads: nothing is recomputed (no float64 products are built), full ranks, no warning."""
    layer = ill_layer(4, 256, 8, -0.5)
    built = []
    exact = factored.GramFactor.__init__

    def spy(self, gram, rows):
        built.append(gram.dtype)
        exact(self, gram, rows)

    monkeypatch.setattr(factored.GramFactor, "__init__", spy)
    values, _, warnings = measure_heads(layer, EVERY, dtype=torch.float32)
    assert set(built) == {torch.float32} and not warnings
    assert (values["rank_q"] == 8).all() and (values["rank_v"] == 8).all()


def test_only_the_unresolved_heads_are_recomputed():
    """One ill-conditioned W_Q among four: that head alone goes to float64 and its values match the dense
    reference; the others keep the float32 products."""
    layer = ill_layer(5, 256, 8, -0.3)
    Q = layer.W_Q.clone()
    Q[2] = torch.tensor(prescribed(np.random.default_rng(9), 256, 10.0 ** np.linspace(0, -4.5, 8)),
                        dtype=torch.float32)
    layer = AttentionLayer(spec=layer.spec, layer=0, W_Q=Q, W_K=layer.W_K, W_V=layer.W_V, W_O=layer.W_O)
    values, _, warnings = measure_heads(layer, EVERY, dtype=torch.float32)
    assert [w for w in warnings if "recomputed" in w] == ["1 of 4 heads recomputed in float64 (float32 Grams "
                                                           "cannot resolve their smallest directions)"]
    want = dense_head(layer, 2)
    for name in ("overlap_qk", "overlap_qv", "qk_effective_rank", "symmetry", "shared_qk_distance"):
        assert_close(values[name][2], want[name], rtol=1e-6, atol=1e-9, what=name)


def test_the_cut_is_relative_to_sigma_max_in_every_precision():
    """σ/σ_max of 3e-5 is kept and 3e-6 dropped, in float32 and float64 alike."""
    rng = np.random.default_rng(0)
    X = np.stack([prescribed(rng, 64, np.array([1.0, 0.5, 3e-5, 3e-6])) for _ in range(2)])
    for dtype in (torch.float32, torch.float64):
        f = GramFactor(torch.tensor(X).to(torch.float64).mT @ torch.tensor(X).to(torch.float64), rows=64)
        assert f.rank.tolist() == [3, 3]
        g = GramFactor((torch.tensor(X, dtype=dtype).mT @ torch.tensor(X, dtype=dtype)), rows=64)
        assert g.unresolved.tolist() == ([True, True] if dtype == torch.float32 else [False, False])


@pytest.mark.parametrize("block", ["encoder", "cross"])
def test_whisper_like_heads_match_the_dense_reference(block):
    """Whisper-base's shape (D = 512, 8 heads of 64) with W_Q and W_K singular values reaching 5e-5 of the largest,
    as its trained heads do: the float32 default gives the dense numpy value of every metric (float32 Grams alone
    were off by 0.27 in overlap_qk on the real model)."""
    rng = np.random.default_rng(11)
    H, D, d = 8, 512, 64
    sig = lambda: np.concatenate([10.0 ** rng.uniform(-1, 0, d - 8), 10.0 ** rng.uniform(-4.3, -3, 8)])  # noqa: E731
    Q = [prescribed(rng, D, sig()) for _ in range(H)]
    K = [0.6 * prescribed(rng, D, sig()) + 0.4 * Q[h] for h in range(H)]
    V = [prescribed(rng, D, 10.0 ** rng.uniform(-1, 0, d)) for _ in range(H)]
    O = [prescribed(rng, D, 10.0 ** rng.uniform(-1, 0, d)).T for _ in range(H)]
    spec = BlockSpec(name=block, n_layers=1, n_heads=H, n_kv_heads=H, d_model=D, d_head=d)
    t = lambda a: torch.tensor(np.asarray(a), dtype=torch.float32)  # noqa: E731
    layer = AttentionLayer(spec=spec, layer=0, W_Q=t(Q), W_K=t(K), W_V=t(V), W_O=t(O))
    values, _, warnings = measure_heads(layer, EVERY, dtype=torch.float32)
    assert any(w.startswith("8 of 8 heads recomputed") for w in warnings)
    for h in range(H):
        want = dense_head(layer, h)
        for name in EVERY:
            assert agree(values[name][h], want[name]), (h, name, values[name][h], want[name])
