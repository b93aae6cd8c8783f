"""Cost: per-head metrics never form a d_model x d_model matrix (checked on every tensor torch produces).
Speed is measured in bench/run.py, never in a timed unit test (these machines are shared and noisy)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from qkinspect.metrics.heads import measure_heads
from qkinspect.metrics.layer_form import layer_form_metrics
from qkinspect.metrics.products import HeadProducts
from qkinspect.metrics.registry import HEAD_METRIC_NAMES
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
