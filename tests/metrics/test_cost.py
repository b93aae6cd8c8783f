"""Cost: per-head metrics never form a d_model x d_model matrix (checked on every tensor torch produces), and a
7B-shaped layer's default metrics stay fast."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from qkinspect.layer import AttentionLayer, BlockSpec
from qkinspect.metrics.heads import HEAD_METRICS, measure_heads
from qkinspect.metrics.layer_form import layer_form_metrics
from qkinspect.metrics.products import HeadProducts
from qkinspect.metrics.registry import HEAD_METRIC_NAMES, resolve_metrics
from tests.metrics.helpers import make_layer


class ShapeLog(TorchDispatchMode):
    """Records the shape of every tensor an aten op returns."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


def _wide(shapes, D: int) -> list[tuple[int, ...]]:
    """Shapes with two or more dimensions of at least D: a d_model x d_model matrix or worse."""
    return [s for s in shapes if sum(x >= D for x in s) >= 2]


def test_per_head_metrics_never_form_a_model_width_square():
    D = 96
    layer = make_layer(1, H=4, G=2, D=D, d=6)
    with ShapeLog() as log:
        measure_heads(layer, HEAD_METRIC_NAMES, spectra=("qk", "qk_eig", "q", "k", "v", "ov", "ov_eig"))
    assert log.shapes and not _wide(log.shapes, D)


def test_the_detector_sees_the_layer_form():
    """Positive control: the opt-in summed form does build a D x D matrix, and the log shows it."""
    D = 96
    p = HeadProducts(make_layer(2, H=4, G=2, D=D, d=6))
    with ShapeLog() as log:
        layer_form_metrics(p.Q, p.K, p.kv)
    assert (D, D) in _wide(log.shapes, D)


@pytest.mark.slow
def test_7b_shaped_layer_default_metrics_are_fast():
    """32 heads, d_model 4096, d_head 128, bf16 as stored: default metrics in well under a second on an idle
    2-core machine; the bound here leaves room for a shared, loaded one."""
    g = torch.Generator().manual_seed(0)
    spec = BlockSpec("decoder", n_layers=1, n_heads=32, n_kv_heads=32, d_model=4096, d_head=128)
    w = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16)  # noqa: E731
    layer = AttentionLayer(spec, 0, w(32, 4096, 128), w(32, 4096, 128), w(32, 4096, 128), w(32, 128, 4096))
    names = [n for n in resolve_metrics(None) if n in HEAD_METRICS]
    times = []
    for _ in range(3):
        t = time.perf_counter()
        measure_heads(layer, names, spectra=("qk",), dtype=torch.float32)
        times.append(time.perf_counter() - t)
    assert min(times) < 2.0, times
