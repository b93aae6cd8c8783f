"""The adapter proofs' tolerance is relative to the values: float32 rounding of large values passes, a wrong value
of any size fails (an absolute 1e-5 once failed SigLIP's pooling output, of size ~10, at 5e-5)."""

from __future__ import annotations

import pytest
import torch

from tests.adapters.harness import RTOL, assert_close, relative_error


@pytest.mark.parametrize("scale", [1e-3, 1.0, 10.0, 1e4])
def test_float32_rounding_passes_at_any_scale(scale):
    exact = torch.randn(64, 48, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * scale
    w = torch.randn(48, 48, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    rounded = (exact.float() @ w.float()).double()  # a float32 product, as a model's forward pass computes it
    assert_close(rounded, exact @ w, f"scale {scale}")
    assert relative_error(rounded * 7, exact @ w * 7) == pytest.approx(relative_error(rounded, exact @ w))


@pytest.mark.parametrize("scale", [1e-3, 1.0, 10.0, 1e4])
def test_a_wrong_value_fails_at_any_scale(scale):
    exact = torch.randn(64, 48, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * scale
    wrong = exact.clone()
    wrong[3, 5] += 1e-4 * exact.abs().max()  # one element off by 1e-4 of the largest: a bias or gain missed
    with pytest.raises(AssertionError, match="relative error"):
        assert_close(wrong, exact)
    assert relative_error(wrong, exact) == pytest.approx(1e-4, rel=1e-6) and 1e-4 > 5 * RTOL
