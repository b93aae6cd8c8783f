"""A real ill-conditioned model: Gemma-3-270m (Q4_K_M GGUF from PyPI), whose W_Q and W_K heads have singular values
down to 3e-3 of the largest. Float32 Grams alone were off by 3.6e-2 in overlap_qv and 2e-2 in qk_effective_rank;
the float32 default must give the float64 value of every metric on every head.

qkinspect reads the GGUF itself (its tensors equal those of transformers' GGUF loader: tests/loading/
test_real_gemma3_gguf.py, whose fixture assembles the file from its packages or skips saying how to install them)."""

from __future__ import annotations

import numpy as np
import pytest

import qkinspect
from tests.loading.test_real_gemma3_gguf import gemma3  # noqa: F401 (the fixture: the .gguf file, or a skip)


@pytest.mark.slow
def test_gemma3_float32_equals_float64(gemma3):  # noqa: F811
    a = qkinspect.analyze(gemma3, metrics="all")
    b = qkinspect.analyze(gemma3, metrics="all", precision="float64")
    assert a.processing.precision == "float32" and len(a.heads) == 18 * 4
    for x, y in zip(a.heads, b.heads, strict=True):
        assert (x.rank_q, x.rank_k, x.rank_v) == (y.rank_q, y.rank_k, y.rank_v) == (256, 256, 256)
        for name, v in y.values.items():
            assert x.values[name] == pytest.approx(v, rel=1e-3, abs=1e-5, nan_ok=True), (x.layer, x.head, name)
    for x, y in zip(a.layers, b.layers, strict=True):
        for name, v in y.values.items():
            assert x.values[name] == pytest.approx(v, rel=1e-3, abs=1e-5, nan_ok=True), (x.layer, name)
        np.testing.assert_allclose(x.head_overlap, y.head_overlap, rtol=1e-3, atol=1e-5)
    # Every W_Q has σ_min/σ_max below 5 %: float32's Grams resolve none of the heads, and the result records it
    # (information that asks nothing of the user: not a warning).
    assert a.processing.recomputed_float64 == 72 and b.processing.recomputed_float64 == 0
    assert not [w for w in a.warnings if "recomputed" in w]
    assert not [w for w in b.warnings if "recomputed" in w or "rank cut" in w]
