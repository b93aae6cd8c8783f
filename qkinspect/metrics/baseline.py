"""The random baseline: symmetry, the shared-QK distance and subspace overlap for Gaussian factors of a block's exact
shapes (fixed seed), so a reader can tell structure from chance (symmetry ~ 0; shared-QK distance ~ sqrt(3/4);
overlap ~ d_head / d_model). Each is computed only when its metric is."""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np
import torch

from qkinspect.layer import AttentionLayer, BlockSpec
from qkinspect.metrics.heads import HEAD_METRICS
from qkinspect.metrics.products import HeadProducts

BASELINE_METRICS = ("symmetry", "shared_qk_distance", "overlap_qk", "overlap_qv", "overlap_kv")


class Chance(NamedTuple):
    """One metric's statistic over Gaussian heads of a block (the analysis records it as `records.Baseline`)."""

    block: str
    metric: str
    mean: float
    std: float  # with Bessel's correction
    n: int


def samples(spec: BlockSpec) -> int:
    """32 Gaussian heads; 16 for wide blocks (d_model x d_head > 2^17, e.g. 4096 x 128), where the statistics
    concentrate (symmetry's spread shrinks like 1/sqrt(d_model d_head)) and drawing them costs as much as a layer."""
    return 32 if spec.d_model * spec.d_head <= 2**17 else 16


def gaussian_layer(spec: BlockSpec, n: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> AttentionLayer:
    """n independent Gaussian heads (W_Q, W_K, W_V entries N(0, 1)) with the block's shapes."""
    g = torch.Generator().manual_seed(seed)
    s = replace(spec, n_heads=n, n_kv_heads=n, n_layers=1, shared_qk=False)
    D, Dk, d, dv = spec.d_model, spec.kv_width, spec.d_head, spec.v_head
    return AttentionLayer(spec=s, layer=0, W_Q=torch.randn(n, D, d, generator=g, dtype=dtype),
                          W_K=torch.randn(n, Dk, d, generator=g, dtype=dtype),
                          W_V=torch.randn(n, Dk, dv, generator=g, dtype=dtype))


def gaussian_baselines(spec: BlockSpec, metrics, *, block: str | None = None, n: int | None = None, seed: int = 0,
                       dtype: torch.dtype = torch.float32, device: str = "cpu") -> list[Chance]:
    """Baselines (mean, std with Bessel's correction, n) of the requested BASELINE_METRICS for one block.

    Example:
        >>> b = gaussian_baselines(spec, ["symmetry"])[0]  # doctest: +SKIP
        >>> abs(b.mean) < 3 * b.std / b.n ** 0.5  # doctest: +SKIP
        True
    """
    names = [m for m in BASELINE_METRICS if m in set(metrics)]
    if not names:
        return []
    p = HeadProducts(gaussian_layer(spec, n or samples(spec), seed, dtype), dtype=dtype, device=device)
    out = []
    for name in names:
        v = HEAD_METRICS[name](p).detach().to("cpu", torch.float64).numpy()
        v = v[np.isfinite(v)]
        if v.size:
            out.append(Chance(block or spec.key, name, float(v.mean()), float(v.std(ddof=1)), int(v.size)))
    return out
