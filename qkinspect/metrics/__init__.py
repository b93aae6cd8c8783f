"""The metrics engine: pure, batched functions of an AttentionLayer's weights (ARCHITECTURE.md §3).

Everything per head comes from d_head x d_head products (`products.HeadProducts`); `registry` defines every
metric; `heads.measure_heads` is the per-layer entry point and `qkinspect.analyze` the whole-model one.
"""

from qkinspect.metrics.registry import METRICS, MetricSpec, definitions, resolve_metrics

__all__ = ["METRICS", "MetricSpec", "definitions", "resolve_metrics"]
