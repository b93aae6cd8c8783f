"""Phi (1, 1.5, 2) and Phi-3.

Phi: separate biased q/k/v projections, output `dense`, a LayerNorm feeding attention (and the parallel MLP),
partial RoPE (`partial_rotary_factor`), and optional per-head LayerNorms on q and k (`qk_layernorm`).

Phi-3: one fused projection, sectioned [q | k | v] along its output rows::

    layers.{i}.self_attn.qkv_proj.weight   (H*d + 2*G*d, D)   rows: H*d query, G*d key, G*d value
    layers.{i}.self_attn.o_proj.weight     (D, H*d)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qkinspect.loading.adapters._decoder import SplitProjectionAdapter, attention_kind, rope_spec
from qkinspect.loading.adapters.fused import Blocks, FusedQKVAdapter, sectioned
from qkinspect.loading.adapters.registry import register

if TYPE_CHECKING:
    from torch import Tensor


@register
class PhiAdapter(SplitProjectionAdapter):
    """Phi: partial rotary, LayerNorm input, dense output; q/k LayerNorm gains (and biases, in `extra`) when
    `qk_layernorm` is set.

    Example:
        >>> with open_model("path/to/phi-2") as m:  # doctest: +SKIP
        ...     m.info.blocks[0].rotary_dims  # 32 of d_head 80
    """

    model_types = ("phi",)
    proj = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "dense"}
    norm_kind = "layernorm"
    qk_norm_kind = "layernorm"

    @property
    def qk_norm_paths(self) -> tuple[str, str] | None:  # type: ignore[override]
        return ("q_layernorm", "k_layernorm") if getattr(self.config, "qk_layernorm", False) else None


@register
class Phi3Adapter(FusedQKVAdapter):
    """Phi-3: fused qkv_proj sectioned [q | k | v]; RMSNorm input; RoPE (partial when the config says so).

    Example:
        >>> with open_model("path/to/phi-3-mini") as m:  # doctest: +SKIP
        ...     next(m.layers()).W_K.shape  # (n_kv_heads, d_model, d_head)
    """

    model_types = ("phi3",)
    layer_path = "layers.{i}"
    attn_path = "self_attn"
    qkv_name = "qkv_proj"
    out_name = "o_proj"
    norm_kind = "rmsnorm"

    def spec_fields(self, d_head: int) -> dict[str, Any]:
        return {**rope_spec(self.config, d_head), "attention_kind": attention_kind(self.config)}

    def layer_extra(self, layer: int) -> dict[str, Any]:
        window = getattr(self.config, "sliding_window", None)  # Phi-3 mini/medium: every layer, when set
        return {"rotary_style": "half", **({"sliding_window": window} if window else {})}

    def layout(self, w: Tensor) -> Blocks:
        s = self._spec
        return sectioned(w, s.n_heads, s.n_kv_heads, s.d_head)  # (H*d + 2*G*d, ...) -> q, k, v
