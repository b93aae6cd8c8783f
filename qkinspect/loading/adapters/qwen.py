"""Qwen2 (q/k/v biases) and Qwen3 (per-head RMSNorm on queries and keys): Llama's tensor names.

Qwen3 layout, beyond Llama's::

    layers.{i}.self_attn.q_norm.weight   (d,)   RMSNorm gain over each query head's d values, shared by heads
    layers.{i}.self_attn.k_norm.weight   (d,)
"""

from __future__ import annotations

from qkinspect.loading.adapters._decoder import SplitProjectionAdapter
from qkinspect.loading.adapters.registry import register


@register
class Qwen2Adapter(SplitProjectionAdapter):
    """Qwen2 / Qwen2-MoE: Llama layout; q/k/v carry biases (read when present), o_proj does not."""

    model_types = ("qwen2", "qwen2_moe")


@register
class Qwen3Adapter(SplitProjectionAdapter):
    """Qwen3 / Qwen3-MoE: Llama layout plus q_norm/k_norm (per head, before RoPE); `qk_norm` is set.

    Example:
        >>> with open_model("path/to/qwen3") as m:  # doctest: +SKIP
        ...     layer = next(m.layers())
        ...     layer.q_norm.shape  # (d_head,): one gain shared by every query head
    """

    model_types = ("qwen3", "qwen3_moe")
    qk_norm_paths = ("q_norm", "k_norm")
