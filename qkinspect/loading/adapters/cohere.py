"""Cohere (Command-R): Llama's tensor names, with a bias-free LayerNorm before attention (shared with the parallel
MLP: attention and MLP both read ``input_layernorm``'s output and add to the same residual), interleaved RoPE
(dims 2i and 2i+1 pair up), and optional per-head LayerNorms on q and k (``use_qk_norm``)::

    layers.{i}.input_layernorm.weight      (D,)     LayerNorm gain (centres; no bias)
    layers.{i}.self_attn.q_norm.weight     (H, d)   one LayerNorm per query head over its d values, own gains
    layers.{i}.self_attn.k_norm.weight     (G, d)
"""

from __future__ import annotations

from typing import Any

from qkinspect.loading.adapters._decoder import SplitProjectionAdapter
from qkinspect.loading.adapters.registry import register


@register
class CohereAdapter(SplitProjectionAdapter):
    """Cohere: LayerNorm input (no bias), interleaved rotary, per-head q/k LayerNorm gains (H, d) / (G, d).

    Example:
        >>> with open_model("path/to/c4ai-command-r") as m:  # doctest: +SKIP
        ...     next(m.layers()).extra["rotary_style"]  # 'interleaved'
    """

    model_types = ("cohere",)
    norm_kind = "layernorm"
    qk_norm_kind = "layernorm"
    rotary_style = "interleaved"

    @property
    def qk_norm_paths(self) -> tuple[str, str] | None:  # type: ignore[override]
        return ("q_norm", "k_norm") if getattr(self.config, "use_qk_norm", False) else None

    def expected_shapes(self, block: str, layer: int) -> dict[str, tuple[int, ...]]:
        shapes, n, s = super().expected_shapes(block, layer), self.names(layer), self._spec
        per_head: dict[str, Any] = {"qn": (s.n_heads, s.d_head), "kn": (s.n_kv_heads, s.d_head)}
        return {**shapes, **{n[r]: shape for r, shape in per_head.items() if r in n}}
