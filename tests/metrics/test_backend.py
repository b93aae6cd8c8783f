"""The bf16 product backend: its products equal the float32 path's, every metric agrees with the float32 route, the
route is chosen only where it should be, and the three-way split of a float32 root is exact."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkinspect.errors import InputError
from qkinspect.loading.cast import Caster
from qkinspect.metrics import backend
from qkinspect.metrics.heads import HEAD_METRICS, measure_products
from qkinspect.metrics.products import HeadProducts, layer_products
from tests.metrics.helpers import make_layer

needs_mkl = pytest.mark.skipif(not backend.available(),
                               reason=f"the bf16 route cannot run here: {backend._unavailable() or '?'}")
BF16_MAX = float(torch.finfo(torch.bfloat16).max)
EVERY_SPECTRUM = ["qk", "q", "k", "v", "ov", "qk_eig", "ov_eig"]


def _clear() -> None:
    for fn in (backend.route, backend._gemm, backend._unavailable):
        fn.cache_clear()


@pytest.fixture(autouse=True)
def fresh_choice():
    """Every test chooses the route afresh, and leaves no choice behind for the next module."""
    _clear()
    yield
    _clear()


def force(monkeypatch, route: str) -> None:
    monkeypatch.setenv(backend.ENV, route)
    backend.route.cache_clear()


def bf16_layer(layer):
    """The layer with its weights rounded to bf16 (the biases stay as they are)."""
    half = {k: getattr(layer, k).bfloat16() for k in ("W_Q", "W_K", "W_V", "W_O") if getattr(layer, k) is not None}
    return replace(layer, **half)


# -- the products -------------------------------------------------------------------------------------------------

def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@needs_mkl
def test_products_equal_the_float32_products():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(6, 300, 16, generator=g).bfloat16()  # (n, rows, d)
    Y = torch.randn(3, 300, 12, generator=g).bfloat16()  # (G, rows, e)
    kv = torch.arange(6) // 2
    Xf, Yf = X.float(), Y.float()
    assert rel(backend.matmul(X.mT, X), Xf.mT @ Xf) < 1e-6  # the Gram
    assert rel(backend.matmul(Y.mT, X, ia=kv), Yf[kv].mT @ Xf) < 1e-6  # paired, each query head with its KV head
    assert rel(backend.matmul(X, X.mT[:, :, :50]), Xf @ Xf.mT[:, :, :50]) < 1e-6  # strided operand
    ones = torch.ones(1, 1, 16).bfloat16().expand(6, 300, 16)  # every stride 0 but the last: copied first
    assert rel(backend.matmul(ones.mT, X), ones.float().mT @ Xf) < 1e-6
    R = torch.randn(6, 16, 16, generator=g)  # a float32 root
    want = torch.linalg.vector_norm(Xf.double() @ R.double().mT, dim=-1)
    got = backend.row_norms(X, R)
    assert ((got.double() - want).abs() / want).max() < 1e-6  # float32 level (float32 bmm itself: ~2e-7)
    Ry = torch.randn(6, 12, 12, generator=g)
    assert rel(backend.row_norms(Y, Ry, idx=kv), torch.linalg.vector_norm(Yf[kv] @ Ry.mT, dim=-1)) < 1e-6
    assert rel(backend.matmul_f32(X, R.mT), Xf @ R.mT) < 1e-6


@needs_mkl
def test_layer_products_agree_on_both_routes():
    """The benchmark's eight products per layer (grouped query heads: 6 over 2 KV heads) on each route."""
    g = torch.Generator().manual_seed(2)
    Q, K, V = (torch.randn(n, 200, 8, generator=g).bfloat16() for n in (6, 2, 2))
    Rq, Rk = torch.randn(6, 8, 8, generator=g), torch.randn(6, 8, 8, generator=g)
    f32 = layer_products(Q, K, V, Rq, Rk, "float32")
    bf16 = layer_products(Q, K, V, Rq, Rk, "bf16")
    assert [tuple(t.shape) for t in f32] == [(6, 8, 8), (2, 8, 8), (2, 8, 8)] + [(6, 8, 8)] * 3 + [(6, 200)] * 2
    for a, b in zip(f32, bf16, strict=True):
        assert b.dtype == torch.float32 and rel(b, a) < 1e-6


@needs_mkl
def test_bf16_products_are_float32_accumulated():
    """Integer entries whose products need more bits than bf16 has: the result is exact only with float32
    accumulation and output."""
    A = torch.full((1, 2, 100), 3.0).bfloat16()
    B = torch.full((1, 100, 2), 7.0).bfloat16()
    assert torch.equal(backend.matmul(A, B), torch.full((1, 2, 2), 2100.0))  # 2100 is not a bf16 number


@needs_mkl
@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(1, 9), st.integers(1, 9), st.integers(1, 9), st.booleans(), st.booleans(),
       st.integers(0, 2**31))
def test_matmul_any_layout_is_exact(n, m, k, p, a_t, b_t, seed):
    """Integer-valued bf16 operands (products need float32 accumulation), plain or transposed views, size-1
    dimensions and an index map: equal to float64 exactly."""
    g = torch.Generator().manual_seed(seed)
    A = torch.randint(-20, 21, (n, m, k), generator=g).bfloat16()
    B = torch.randint(-20, 21, (n, k, p), generator=g).bfloat16()
    A = A.mT.contiguous().mT if a_t else A  # same values, column-major matrices
    B = B.mT.contiguous().mT if b_t else B
    ia = torch.randint(0, n, (n + 1,), generator=g)
    ib = torch.randint(0, n, (n + 1,), generator=g)
    assert torch.equal(backend.matmul(A, B, ia=ia, ib=ib).double(), A.double()[ia] @ B.double()[ib])


def test_split3_known_value():
    x = torch.tensor([1 + 2**-9 + 2**-20, -3.14159265, 1e-30, 0.0])
    hi, mid, lo = backend.split3(x)
    assert all(t.dtype == torch.bfloat16 for t in (hi, mid, lo))
    assert torch.equal(hi.double() + mid.double() + lo.double(), x.double())
    assert float(hi[0]) == 1.0 and float(mid[0]) != 0.0  # the low bits really live in the lower terms


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(width=32, min_value=-BF16_MAX, max_value=BF16_MAX, allow_nan=False,
                          allow_subnormal=False).filter(lambda v: v == 0 or abs(v) > 2**-100), min_size=1,
                max_size=64))
def test_split3_is_exact(values):
    """hi + mid + lo == x exactly for float32 x in the normal range: away from the bottom, where the lower terms
    would underflow bf16's normal range, and up to bf16's largest number (above it `hi` rounds to inf)."""
    x = torch.tensor(values, dtype=torch.float32)
    hi, mid, lo = backend.split3(x)
    assert torch.equal(hi.double() + mid.double() + lo.double(), x.double())
    assert torch.equal((hi.float() + mid.float()) + lo.float(), x)


# -- every metric, both routes --------------------------------------------------------------------------------------

def measure(layer, heads=None, dtype=torch.float32):
    p = HeadProducts(layer, heads, dtype=dtype)
    values, spectra, num = measure_products(p, list(HEAD_METRICS), EVERY_SPECTRUM)
    return p, values, spectra


# -- how far apart two float32 routes may be, from the numerics (not from one machine's BLAS) -------------------------
# Both routes read the same bf16 numbers; a product of two bf16 numbers is exact in float32 (8 + 8 significant bits
# <= 24), so the routes differ only in how float32 sums are ordered and rounded (DESIGN §4: reading bf16 and
# accumulating in float32 *is* the float32 route). A float32 sum of n exact products errs by at most
# gamma_n = n u / (1 - n u) times the sum of their moduli (u = 2^-24) in the worst case, and by LAM sqrt(n) u times
# it with probability >= 1 - 2 exp(-LAM^2 / 2) per sum, whatever the order, blocking or FMA use (Higham & Mary, SIAM
# J. Sci. Comput. 2019, Thm 2.4: rounding errors as independent, mean-zero). The worst case (~n u: 2e-5 relative at
# n = 384) is as loose as bf16's own rounding after the eigenvalue's conditioning and would let a route that wrote
# its sums in bf16 pass, so the test takes the probabilistic bound with LAM = 6 (one sum in 1e8 beyond it): a
# product A^T B then errs by at most LAM sqrt(n) u || |A|^T |B| ||_F. The decompositions (LAPACK syevd/geev/gesdd,
# Cholesky) are backward stable: the computed spectrum is the exact one of a matrix within d u ||C|| of the d x d
# matrix C. Eigenvalues of a non-normal C move by up to ||dC|| / s_i to first order (s_i = |y_i^H x_i| over unit
# left/right eigenvectors); singular values are perfectly conditioned (Weyl); those from a Gram, through its
# eigenvalues sigma^2: |sqrt a - sqrt b| <= min(|a - b| / sqrt b, sqrt|a - b|). Each route is within its bound of
# the exact value, so two routes are within twice it. On MiniLM the bound stays well below bf16's rounding (2^-9
# relative), and a route that rounds its products to bf16 fails it (`test_the_spectrum_bound_would_catch_...`).
U32 = 2.0 ** -24
LAM = 6.0


def _product_error(A: np.ndarray, B: np.ndarray) -> float:
    """Bound on ||float32 A^T B - A^T B||_F for exact-product sums over A's n rows (A: n x a, B: n x b)."""
    return LAM * np.sqrt(A.shape[0]) * U32 * float(np.linalg.norm(np.abs(A).T @ np.abs(B)))


def _gram_error(X: np.ndarray) -> float:
    """Bound on the error of X^T X as the roots see it: the sums, and the factorisation's backward error."""
    return _product_error(X, X) + X.shape[1] * U32 * float(np.linalg.norm(X, 2)) ** 2


def _root_change(dl: float, sigma: np.ndarray) -> np.ndarray:
    """|sqrt(s^2 + e) - s| for |e| <= dl: at most min(dl / s, sqrt(dl)), written without dividing by s = 0."""
    m = np.maximum(sigma, np.sqrt(dl))
    return np.divide(dl, m, out=np.zeros_like(m), where=m > 0)  # 0 where dl = s = 0 (a zero head)


def _root_product_bound(A: np.ndarray, B: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """|dsigma_i| for the singular values of A B^T (A n x d, B n' x d) computed as svdvals(R_A R_B^T) from the
    roots of the two Grams, for one route: the Grams' errors move sigma^2 by E_A s1(B)^2 + E_B s1(A)^2 (Weyl on
    M^T M), the d-long product of the roots and the SVD add (LAM sqrt(d) u + d u) ||A||_F ||B||_F."""
    s1 = lambda X: float(np.linalg.norm(X, 2))  # noqa: E731
    dl = _gram_error(A) * s1(B) ** 2 + _gram_error(B) * s1(A) ** 2
    d = A.shape[1]
    direct = (LAM * np.sqrt(d) + d) * U32 * np.linalg.norm(A) * np.linalg.norm(B)
    return _root_change(dl, sigma) + direct


def _eig_bound(C: np.ndarray, A: np.ndarray, B: np.ndarray, at: np.ndarray) -> np.ndarray:
    """|dlambda| for each eigenvalue in `at` of C = A^T B computed in float32, for one route: (product error +
    eigensolver's backward error) / s_i, with s_i of the exact eigenvalue nearest each of `at`."""
    import scipy.linalg

    w, vl, vr = scipy.linalg.eig(C, left=True, right=True)
    s = np.abs(np.einsum("ij,ij->j", vl.conj(), vr)) / (np.linalg.norm(vl, axis=0) * np.linalg.norm(vr, axis=0))
    dC = _product_error(A, B) + C.shape[0] * U32 * np.linalg.norm(C)
    nearest = np.abs(at[:, None] - w[None, :]).argmin(1)
    return dC / s[nearest]


def spectrum_bound(p64: HeadProducts, key: str, h: int, ref: np.ndarray) -> np.ndarray:
    """The float32 error bound of one route on spectrum `key` of selected head h (aligned with `ref`, the float64
    spectrum), from the float64 factors of `p64`."""
    f = lambda t: t[h].numpy()  # noqa: E731
    Q, K, V = f(p64.Q), f(p64.K[p64.kv]), f(p64.V[p64.kv])
    O = f(p64.O).T if p64.has_o else None  # (D, dv): W_Oᵀ
    if key in ("q", "k", "v"):
        X = {"q": Q, "k": K, "v": V}[key]
        return _root_change(_gram_error(X), ref)
    if key == "qk":
        return _root_product_bound(Q, K, ref)
    if key == "ov":
        return _root_product_bound(V, O, ref)
    if key == "qk_eig":
        return _eig_bound(f(p64.c_qk), K, Q, ref)
    return _eig_bound(f(p64.c_ov), V, O, ref)


def assert_spectra_agree(p64: HeadProducts, s32: dict, s16: dict, s64: dict) -> float:
    """Every spectrum of the two routes within twice one route's bound; returns the median bound relative to the
    values it bounds (for the test that the bound could fail)."""
    rel = []
    for key in s32:
        for h, (a, b, ref) in enumerate(zip(s32[key], s16[key], s64[key], strict=True)):
            assert np.array_equal(np.isnan(a), np.isnan(b)), key
            if np.isnan(a).any():
                continue
            tol = 2 * spectrum_bound(p64, key, h, ref)
            if key.endswith("_eig"):  # nearest, not by rank: equal moduli (conjugate pairs) may sort either way
                diff = np.abs(a.astype(complex)[:, None] - b.astype(complex)[None, :]).min(1)
                tol = tol[np.abs(a[:, None] - ref[None, :]).argmin(1)]
            else:
                diff = np.abs(a.astype(float) - b.astype(float))
            assert (diff <= tol).all(), (key, h, diff.max(), (diff / tol).max())
            rel.append(tol[ref != 0] / np.abs(ref[ref != 0]))
    return float(np.median(np.concatenate(rel))) if rel else 0.0


def assert_routes_agree(monkeypatch, layer, heads=None) -> None:
    """Every metric and spectrum of the bf16 route equals the float32 route's to 1e-6 (relative above 1). Where a
    metric amplifies rounding (directionality subtracts nearly equal norms) float32 is itself ~1e-6 from float64,
    and two float32 computations differ by as much: there the bf16 route must be within float32's own error on
    the layer (3x its largest) of the float64 value. Spectra: within twice the float32 error bound above."""
    force(monkeypatch, "float32")
    p32, v32, s32 = measure(layer, heads)
    force(monkeypatch, "bf16")
    p16, v16, s16 = measure(layer, heads)
    assert (p32.route, p16.route) == ("float32", "bf16")
    p64, v64, s64 = measure(layer, heads, dtype=torch.float64)
    for name in v32:
        a, b, ref = v32[name], v16[name], v64[name]
        assert np.array_equal(np.isnan(a), np.isnan(b)), name
        ok = ~np.isnan(a)
        if not ok.any():
            continue
        a, b, ref = a[ok], b[ok], ref[ok]
        scale = np.maximum(1, np.abs(ref))  # relative for values above 1, absolute below
        same = np.abs(b - a) <= 1e-6 * scale
        no_worse = np.abs(b - ref) <= 3 * np.abs(a - ref).max() + 1e-6 * scale  # float32's error on this layer
        assert (same | no_worse).all(), (name, np.abs(b - a).max(), np.abs(a - ref).max(), np.abs(b - ref).max())
    assert_spectra_agree(p64, s32, s16, s64)


def with_bad_heads(layer):
    """Query head 1 with a NaN, KV head 0's key with an inf, query head 2 with entries whose squares overflow."""
    Q, K = layer.W_Q.clone(), layer.W_K.clone()
    Q[1, 3, 0] = float("nan")
    K[0, 5, 1] = float("inf")
    Q[2, 0, :] = 3e38
    return replace(layer, W_Q=Q, W_K=K)


LAYERS = {
    "gqa": dict(H=8, G=2, D=256, d=16),
    "mha": dict(H=4, G=4, D=96, d=8),
    "mqa, dv != d": dict(H=6, G=1, D=64, d=8, dv=4),
    "cross (Dk != D)": dict(H=4, G=2, D=48, Dk=40, d=6),
    "rank-deficient": dict(H=4, G=2, D=64, d=8, q_ranks=[None, 3, 0, None], k_ranks=[2, None]),
}


@needs_mkl
@pytest.mark.parametrize("shape", LAYERS.values(), ids=LAYERS.keys())
@pytest.mark.parametrize("heads", [None, torch.tensor([3, 0, 2])], ids=["all", "subset"])
def test_every_metric_agrees_on_random_bf16_heads(monkeypatch, shape, heads):
    assert_routes_agree(monkeypatch, bf16_layer(make_layer(7, dtype=torch.float32, **shape)), heads)


@needs_mkl
def test_non_finite_heads_are_nan_on_both_routes(monkeypatch):
    layer = with_bad_heads(bf16_layer(make_layer(8, H=4, G=2, D=64, d=8, dtype=torch.float32)))
    assert_routes_agree(monkeypatch, layer)
    force(monkeypatch, "bf16")
    p, values, _ = measure(layer)
    assert p.bad.tolist() == [True, True, True, False]  # heads 0, 1 read KV head 0 (inf); 1 NaN; 2 overflows
    assert np.isnan(values["symmetry"][:3]).all() and np.isfinite(values["symmetry"][3])
    assert p.Q.dtype == torch.float32 and torch.isfinite(p.Q).all()  # the float factors, bad heads zeroed


@needs_mkl
def test_float_factors_stay_float32(monkeypatch):
    """The bf16 route reads bf16, but what it hands out (Q, K, V, O, means) is float32, and equal to the cast."""
    force(monkeypatch, "bf16")
    layer = bf16_layer(make_layer(9, H=4, G=2, D=32, d=4, dtype=torch.float32))
    p = HeadProducts(layer)
    assert p.route == "bf16" and p._raw["Q"].dtype == torch.bfloat16
    for name, stored in (("Q", layer.W_Q), ("K", layer.W_K), ("V", layer.W_V), ("O", layer.W_O)):
        assert torch.equal(getattr(p, name), stored.float())
    mq, mk, _ = p.means
    assert torch.allclose(mq, layer.W_Q.float().mean(-2), rtol=1e-6, atol=1e-7)
    assert torch.allclose(mk, layer.W_K.float().mean(-2)[p.kv], rtol=1e-6, atol=1e-7)


def test_float64_gpu_and_other_dtypes_never_take_the_bf16_route(monkeypatch):
    monkeypatch.setattr(backend, "_unavailable", lambda: "")  # as if the routine ran here
    force(monkeypatch, "bf16")
    assert backend.uses_bf16(torch.float32, "cpu")
    assert not backend.uses_bf16(torch.float64, "cpu")
    assert not backend.uses_bf16(torch.float32, "cuda")
    assert not backend.uses_bf16(torch.float32, "meta")
    layer = bf16_layer(make_layer(10, dtype=torch.float32))
    assert HeadProducts(layer, dtype=torch.float64).route == "float64"
    assert HeadProducts(make_layer(10, dtype=torch.float32)).route == "float32"  # float32 weights: the float route
    mixed = replace(layer, W_V=layer.W_V.float())
    assert HeadProducts(mixed).route == "float32"  # one factor not bf16: the float route throughout


# -- real weights rounded to bf16 -----------------------------------------------------------------------------------

def _demo_dir() -> Path:
    demo = pytest.importorskip("qkinspect.demo")
    try:
        return demo.demo_path()
    except Exception as e:  # noqa: BLE001 (the demo extra is absent)
        pytest.skip(str(e))


@needs_mkl
def test_every_metric_agrees_on_minilm_rounded_to_bf16(monkeypatch):
    from qkinspect.loading import open_model

    with open_model(_demo_dir()) as m:
        for layer in m.layers(layers=[0, 3, 5], dtype=torch.float32):
            assert_routes_agree(monkeypatch, bf16_layer(layer))


@needs_mkl
def test_the_spectrum_bound_would_catch_a_bf16_rounding(monkeypatch):
    """The bound is no blanket: on MiniLM it stays well below bf16's rounding (2^-9 relative), and a bf16 route
    whose products were written in bf16 (not float32) fails it."""
    from qkinspect.loading import open_model

    with open_model(_demo_dir()) as m:
        layer = bf16_layer(next(iter(m.layers(layers=[3], dtype=torch.float32))))
    force(monkeypatch, "float32")
    _, _, s32 = measure(layer)
    p64, _, s64 = measure(layer, dtype=torch.float64)
    assert assert_spectra_agree(p64, s32, s32, s64) < 2.0 ** -9
    force(monkeypatch, "bf16")
    backend.route()  # chosen (and self-tested) before the rounding goes in
    exact = backend.matmul
    monkeypatch.setattr(backend, "matmul", lambda A, B, **k: exact(A, B, **k).bfloat16().float())
    _, _, s16 = measure(layer)
    with pytest.raises(AssertionError):
        assert_spectra_agree(p64, s32, s16, s64)


@needs_mkl
@pytest.mark.slow
def test_every_metric_agrees_on_smollm2_rounded_to_bf16(monkeypatch):
    """SmolLM2-135M (GGUF Q4_1, dequantised): grouped-query attention, 9 query heads over 3 KV heads."""
    from qkinspect.loading import open_model
    from tests.loading.test_real_weights import SMOLLM2, package_file

    path = package_file(*SMOLLM2)
    with open_model(path) as m:
        for layer in m.layers(layers=[0, 14, 29], dtype=torch.float32):
            assert layer.spec.n_kv_heads < layer.spec.n_heads
            assert_routes_agree(monkeypatch, bf16_layer(layer))
            assert_routes_agree(monkeypatch, bf16_layer(layer), torch.tensor([8, 1, 4]))


@needs_mkl
def test_analyze_reads_a_bf16_checkpoint_without_casting(monkeypatch, tmp_path):
    """A bf16 checkpoint end to end: the loader keeps W_Q/W_K/W_V in bf16 (no cast), the records equal the
    float32 route's, and the processing record says which route computed them."""
    import shutil

    from safetensors.torch import load_file, save_file

    import qkinspect

    src = _demo_dir()
    for f in src.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy(f, tmp_path / f.name)
    state = {k: v.bfloat16() if v.is_floating_point() else v for k, v in load_file(src / "model.safetensors").items()}
    save_file(state, tmp_path / "model.safetensors")

    seen = []
    init = HeadProducts.__init__

    def spy(self, layer, *a, **k):
        if layer.spec.n_layers == 6 and k.get("dtype") == torch.float32:  # the model's layers as the loader gave
            # them (not the random baseline's, nor heads recomputed in float64)
            seen.append(layer.W_Q.dtype)
        init(self, layer, *a, **k)

    monkeypatch.setattr(HeadProducts, "__init__", spy)
    force(monkeypatch, "float32")
    a = qkinspect.analyze(tmp_path, layers="0,4", metrics=["all"])
    assert seen == [torch.float32] * 2
    force(monkeypatch, "bf16")
    b = qkinspect.analyze(tmp_path, layers="0,4", metrics=["all"])
    assert seen[2:] == [torch.bfloat16] * 2  # the loader cast only on the float32 route
    assert (a.processing.products, b.processing.products) == ("float32", "bf16")
    ref = qkinspect.analyze(tmp_path, layers="0,4", metrics=["all"], precision="float64")
    for name in a.heads[0].values:  # as assert_routes_agree: equal, or within float32's own error of float64
        x, y, r = (np.array([h.values[name] for h in res.heads]) for res in (a, b, ref))
        assert np.array_equal(np.isnan(x), np.isnan(y)), name
        ok = ~np.isnan(x)
        x, y, r = x[ok], y[ok], r[ok]
        scale = np.maximum(1, np.abs(r))
        same = np.abs(y - x) <= 2e-6 * scale
        no_worse = np.abs(y - r) <= 3 * np.abs(x - r).max() + 1e-6 * scale
        assert (same | no_worse).all(), (name, np.abs(y - x).max(), np.abs(x - r).max(), np.abs(y - r).max())
    folded = qkinspect.analyze(tmp_path, layers="0", metrics=["symmetry"], fold_ln=True)
    assert seen[-1] == torch.float32 and folded.processing.products == "float32"  # a fold scales in float32
    assert qkinspect.analyze(tmp_path, layers="0", metrics=["symmetry"], precision="float64"
                             ).processing.products == "float64"


# -- choosing the route -------------------------------------------------------------------------------------------

def mock_machine(monkeypatch, flags: set[str], symbol: bool = True, exact: bool = True) -> None:
    monkeypatch.delenv(backend.ENV, raising=False)
    monkeypatch.setattr(backend, "_cpu_flags", lambda: flags)
    monkeypatch.setattr(backend, "_find_gemm", lambda: (lambda *args: None) if symbol else None)
    monkeypatch.setattr(backend, "_self_test", lambda: exact)
    _clear()


@pytest.mark.parametrize("flags, symbol, exact, want", [
    ({"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}, True, True, "bf16"),  # Sapphire Rapids
    ({"avx2", "avx512f", "avx512_bf16"}, True, True, "float32"),  # AVX512-BF16 only: slower than float32
    ({"avx2", "avx512f"}, True, True, "float32"),  # Ice Lake
    ({"avx2"}, True, True, "float32"),  # this kind of machine (AMD EPYC, AVX2)
    ({"avx512_bf16", "amx_tile", "amx_bf16"}, False, True, "float32"),  # symbol missing
    ({"avx512_bf16", "amx_tile", "amx_bf16"}, True, False, "float32"),  # self-test fails
    (set(), True, True, "float32"),  # no /proc/cpuinfo (not Linux)
], ids=["amx", "avx512-bf16-only", "ice-lake", "avx2", "no-symbol", "self-test-fails", "no-flags"])
def test_auto_selection(monkeypatch, flags, symbol, exact, want):
    mock_machine(monkeypatch, flags, symbol, exact)
    assert backend.route() == want
    assert backend.best_route() == want


def test_self_test_that_raises_means_unavailable(monkeypatch):
    mock_machine(monkeypatch, {"amx_bf16"})

    def broken():
        raise RuntimeError("boom")

    monkeypatch.setattr(backend, "_self_test", broken)
    assert backend.route() == "float32"
    assert "self-test" in backend._unavailable()


def test_override(monkeypatch):
    mock_machine(monkeypatch, {"amx_bf16"})
    force(monkeypatch, "float32")
    assert backend.route() == "float32"  # even where bf16 would be chosen
    mock_machine(monkeypatch, {"avx2"})
    force(monkeypatch, "BF16")
    assert backend.route() == "bf16"  # forced on a machine that would not choose it
    assert backend.best_route() == "float32"  # the benchmark's question is the machine's, not the override's
    force(monkeypatch, "fastest")
    with pytest.raises(InputError, match="QKINSPECT_PRODUCTS='fastest': choose auto, float32 or bf16"):
        backend.route()


@pytest.mark.parametrize("symbol, exact, why", [(False, True, "does not export"), (True, False, "not exact")])
def test_forcing_bf16_where_it_cannot_run_is_an_input_error(monkeypatch, symbol, exact, why):
    mock_machine(monkeypatch, {"amx_bf16"}, symbol, exact)
    force(monkeypatch, "bf16")
    with pytest.raises(InputError, match=f"QKINSPECT_PRODUCTS=bf16: the bf16 product route cannot run here: .*{why}"):
        backend.route()


def test_real_self_test_runs_here():
    """On this machine the routine is either absent or exact: a self-test that crashes would be a bug."""
    problem = backend._unavailable()
    assert problem == "" or "does not export" in problem or "not exact" in problem


def test_caster_keeps_bf16_uncast_but_copied():
    cast = Caster(torch.float32, recycle=True, keep=[torch.bfloat16])
    src = torch.ones(2, 3, dtype=torch.bfloat16)
    a, b = cast(src), cast(torch.ones(2, 3, dtype=torch.float16))
    assert a.dtype == torch.bfloat16 and b.dtype == torch.float32
    assert a.untyped_storage().data_ptr() != src.untyped_storage().data_ptr()  # a copy: no file mapping kept


def test_cli_bad_override_is_one_line(monkeypatch):
    from typer.testing import CliRunner

    from qkinspect.cli.app import app

    _demo_dir()
    monkeypatch.setenv(backend.ENV, "nonsense")
    r = CliRunner().invoke(app, ["analyze", "--layers", "0", "--metrics", "symmetry"])
    assert r.exit_code == 2
    assert "error: QKINSPECT_PRODUCTS='nonsense': choose auto, float32 or bf16" in r.output
    assert "Traceback" not in r.output


# -- the loader on the bf16 route -----------------------------------------------------------------------------------

def _tiny_bf16(tmp_path, name: str):
    """A tiny random Llama (its weights reshaped into heads) or DeepSeek-V3 (W_Q, W_K, W_V composed from latent
    projections and norm gains), saved in bf16."""
    tf = pytest.importorskip("transformers")
    from tests.adapters.harness import randomise_, save_tiny

    common = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=99,
                  max_position_embeddings=64)
    if name == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(num_key_value_heads=2, **common))
    else:
        model = tf.DeepseekV3ForCausalLM(tf.DeepseekV3Config(
            num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
            v_head_dim=6, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=16,
            first_k_dense_replace=1, n_group=2, topk_group=1, **common))
    return save_tiny(randomise_(model, seed=4).to(torch.bfloat16), tmp_path / name)


@pytest.mark.parametrize("name", ["llama", "deepseek"])
def test_loader_keeps_bf16_uncast_and_exact(tmp_path, name):
    """Layers read with bf16 kept equal the cast ones exactly. Llama's W_Q/W_K/W_V are views of the stored
    tensors (kept bf16); DeepSeek's are composed, in float32 by the adapter itself (so they come out float32)."""
    from qkinspect.loading import open_model

    with open_model(_tiny_bf16(tmp_path, name)) as m:
        assert m.info.dtype == "bfloat16"
        cast = list(m.layers(dtype=torch.float32))
        kept = list(m.layers(dtype=torch.float32, keep=[torch.bfloat16]))
    for a, b in zip(cast, kept, strict=True):
        for k in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V"):
            x, y = getattr(a, k), getattr(b, k)
            assert (x is None) == (y is None), k
            if x is not None:
                assert torch.equal(y.float(), x), k
        assert b.W_Q.dtype == (torch.bfloat16 if name == "llama" else torch.float32)


def test_loader_rebuilds_a_layer_computed_in_bf16(tmp_path, monkeypatch):
    """An adapter that does arithmetic on the weights it reads would round in bf16: that layer is built again
    from the cast tensors, so it equals the cast path's."""
    from qkinspect.loading import open_model

    with open_model(_tiny_bf16(tmp_path, "llama")) as m:
        build = m.adapter.build

        def scaling_build(block, layer, tensors):  # W_Q times a constant that bf16 cannot hold exactly
            built = build(block, layer, tensors)
            return replace(built, W_Q=built.W_Q * 1.001)

        monkeypatch.setattr(m.adapter, "build", scaling_build)
        cast = list(m.layers(dtype=torch.float32))
        kept = list(m.layers(dtype=torch.float32, keep=[torch.bfloat16]))
    for a, b in zip(cast, kept, strict=True):
        assert b.W_Q.dtype == torch.float32 and torch.equal(b.W_Q, a.W_Q)
        assert torch.equal(b.W_K.float(), a.W_K)
