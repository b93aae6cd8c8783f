"""StableLM (stabilityai/stablelm-*): Llama's tensor names with a LayerNorm (gain and bias) before attention, q/k/v
biases when ``use_qkv_bias`` (o_proj has none), partial RoPE (``partial_rotary_factor``, default 0.25) in the
rotate-half style, optional parallel residual (attention still reads ``input_layernorm``), and optional per-head
LayerNorms on q and k (``qk_layernorm``), stored as one bias-free LayerNorm module per head::

    layers.{i}.self_attn.q_layernorm.norms.{h}.weight   (d,)   query head h's gains, h < H
    layers.{i}.self_attn.k_layernorm.norms.{g}.weight   (d,)   key head g's gains, g < G

The per-head gains are stacked to (H, d) and (G, d): the same canonical form as Cohere's q/k norms.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from qkinspect.loading.adapters._decoder import SplitProjectionAdapter
from qkinspect.loading.adapters.registry import register

if TYPE_CHECKING:
    from torch import Tensor


@register
class StableLmAdapter(SplitProjectionAdapter):
    """StableLM: LayerNorm input, partial rotary; per-head q/k LayerNorm gains (H, d) / (G, d) with qk_layernorm.

    Example:
        >>> with open_model("path/to/stablelm-2-1_6b") as m:  # doctest: +SKIP
        ...     m.info.blocks[0].rotary_dims  # 16 of d_head 64
    """

    model_types = ("stablelm",)
    norm_kind = "layernorm"
    qk_norm_kind = "layernorm"

    def has_qk_norm(self) -> bool:
        return bool(getattr(self.config, "qk_layernorm", False))

    def spec_fields(self, d_head: int) -> dict[str, Any]:
        return {**super().spec_fields(d_head), "qk_norm": self.has_qk_norm()}

    def names(self, layer: int) -> dict[str, str]:
        n = super().names(layer)
        if self.has_qk_norm():
            p = f"{self.layer_path.format(i=layer)}.{self.attn_path}"
            n.update({f"qn{h}": f"{p}.q_layernorm.norms.{h}.weight" for h in range(self._spec.n_heads)})
            n.update({f"kn{g}": f"{p}.k_layernorm.norms.{g}.weight" for g in range(self._spec.n_kv_heads)})
        return n

    def expected_shapes(self, block: str, layer: int) -> dict[str, tuple[int, ...]]:
        shapes, d = super().expected_shapes(block, layer), self._spec.d_head
        per_head = {name: (d,) for role, name in self.names(layer).items() if role[:2] in ("qn", "kn")}
        return {**shapes, **per_head}

    def qk_norm_fields(self, t: Mapping[str, Tensor]) -> dict[str, Any]:
        s = self._spec
        q = [t.get(f"qn{h}") for h in range(s.n_heads)]
        k = [t.get(f"kn{g}") for g in range(s.n_kv_heads)]
        if not self.has_qk_norm() or any(w is None for w in q + k):
            return {}
        import torch

        extra = {"qk_norm_kind": self.qk_norm_kind, "qk_norm_scope": self.qk_norm_scope}
        return {"q_norm": torch.stack(q), "k_norm": torch.stack(k), "extra": extra}  # H x (d,) -> (H, d)
