"""Gemma, Gemma2, Gemma3 (text): Llama's tensor names with Gemma's quirks.

- RMSNorm multiplies by (1 + weight): the input norm is `Norm(add_unit_offset=True)`, and the Gemma3 q/k-norm
  gains are stored as the multipliers they are, 1 + weight.
- head_dim is a config field: head_dim * n_heads need not equal hidden_size.
- Gemma2/3 scale scores by query_pre_attn_scalar ** -0.5, not head_dim ** -0.5, cap logits with tanh
  (`extra["attn_logit_softcapping"]`), and alternate sliding-window and full layers (`extra["layer_type"]`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qkinspect.loading.adapters._decoder import SplitProjectionAdapter
from qkinspect.loading.adapters.registry import register

if TYPE_CHECKING:
    from torch import Tensor


@register
class GemmaAdapter(SplitProjectionAdapter):
    """Gemma: RMSNorm with a unit offset; RoPE; multi-query or grouped attention; scale head_dim ** -0.5.

    Example:
        >>> with open_model("path/to/gemma") as m:  # doctest: +SKIP
        ...     next(m.layers()).norm_q.gain  # 1 + stored weight
    """

    model_types = ("gemma",)
    norm_unit_offset = True


@register
class Gemma2Adapter(GemmaAdapter):
    """Gemma2: scale query_pre_attn_scalar ** -0.5; logit soft-capping; sliding and full layers."""

    model_types = ("gemma2",)

    def spec_fields(self, d_head: int) -> dict[str, Any]:
        scalar = getattr(self.config, "query_pre_attn_scalar", None)
        return {**super().spec_fields(d_head), "scale": None if scalar is None else float(scalar) ** -0.5}

    def layer_extra(self, layer: int) -> dict[str, Any]:
        extra = super().layer_extra(layer)
        cap = getattr(self.config, "attn_logit_softcapping", None)
        if cap is not None:
            extra["attn_logit_softcapping"] = float(cap)  # scores -> cap * tanh(scores / cap)
        return extra


@register
class Gemma3TextAdapter(Gemma2Adapter):
    """Gemma3 text: Gemma2 plus per-head q/k RMSNorm whose gains are 1 + weight."""

    model_types = ("gemma3_text",)
    qk_norm_paths = ("q_norm", "k_norm")

    def qk_gain(self, w: Tensor) -> Tensor:
        return w + 1
