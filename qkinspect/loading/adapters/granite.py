"""Granite (IBM): Llama's tensor names and RMSNorm, with muP-style multipliers. Only ``attention_multiplier`` acts
inside attention: it *replaces* 1/sqrt(d_head) as the multiplier on q·k, so it is the recorded scale. The embedding
and residual multipliers scale the residual stream, which the RMSNorm before attention divides out."""

from __future__ import annotations

from typing import Any

from qkinspect.loading.adapters._decoder import SplitProjectionAdapter
from qkinspect.loading.adapters.registry import register


@register
class GraniteAdapter(SplitProjectionAdapter):
    """Granite (ibm-granite/granite-3.*): scale = ``attention_multiplier``; biases when ``attention_bias``.

    Example:
        >>> with open_model("path/to/granite") as m:  # doctest: +SKIP
        ...     m.info.blocks[0].score_scale  # config.attention_multiplier, e.g. 0.015625
    """

    model_types = ("granite",)

    def spec_fields(self, d_head: int) -> dict[str, Any]:
        return {**super().spec_fields(d_head), "scale": float(self.config.attention_multiplier)}
