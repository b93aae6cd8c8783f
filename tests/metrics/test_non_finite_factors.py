"""A head with NaN or inf in its factors: NaN for that head, the other heads exactly as without it (issue 39)."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkinspect.metrics.composition import r_factor
from qkinspect.metrics.directions import factored_svd


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(1, 4), bad=st.data(), value=st.sampled_from([math.nan, math.inf]))
def test_one_bad_head_spoils_only_itself(seed, n, bad, value):
    g = torch.Generator().manual_seed(seed)
    A, B = torch.randn(n, 12, 3, generator=g, dtype=torch.float64), torch.randn(n, 10, 3, generator=g,
                                                                                  dtype=torch.float64)
    h = bad.draw(st.integers(0, n - 1))
    A2 = A.clone()
    A2[h, 5, 1] = value
    ok = [i for i in range(n) if i != h]
    U, S, V = factored_svd(A, B)
    U2, S2, V2 = factored_svd(A2, B)
    assert torch.isnan(S2[h]).all() and torch.isnan(U2[h]).all() and torch.isnan(V2[h]).all()
    for x, y in ((U, U2), (S, S2), (V, V2)):
        torch.testing.assert_close(x[ok], y[ok])
    R, R2 = r_factor(A), r_factor(A2)
    assert torch.isnan(R2[h]).all()
    torch.testing.assert_close(R[ok], R2[ok])
