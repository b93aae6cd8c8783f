"""GPT-2: one fused Conv1D projection sectioned [q | k | v] by *columns*; learned absolute positions.

Conv1D stores [in, out] (the transpose of nn.Linear): ``y = x @ weight + bias``.

    h.{i}.ln_1.{weight,bias}          (D,)       LayerNorm feeding attention
    h.{i}.attn.c_attn.weight          (D, 3*D)   columns: D query, D key, D value
    h.{i}.attn.c_attn.bias            (3*D,)
    h.{i}.attn.c_proj.{weight,bias}   (D, D)     [in = H*d, out = D]

Scale: 1/sqrt(d_head), or 1 when `scale_attn_weights` is off, further divided by (layer + 1) when
`scale_attn_by_inverse_layer_idx` is on; then each layer's record carries its own spec with that scale.
Cross-attention layers (`add_cross_attention`) are not read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from qkinspect.layer import AttentionLayer, BlockSpec
from qkinspect.loading.adapters._decoder import with_scale
from qkinspect.loading.adapters._fused import Blocks, FusedQKVAdapter, sectioned
from qkinspect.loading.adapters.registry import register


@register
class GPT2Adapter(FusedQKVAdapter):
    """GPT-2: Conv1D c_attn sectioned [q | k | v] by columns.

    Example:
        >>> with open_model("path/to/gpt2") as m:  # doctest: +SKIP
        ...     next(m.layers()).W_Q.shape  # (12, 768, 64)
    """

    model_types = ("gpt2",)
    attn_path = "attn"
    qkv_name = "c_attn"
    out_name = "c_proj"
    norm_path = "ln_1"

    def spec_fields(self, d_head: int) -> dict[str, Any]:
        return {"positional": "absolute", "scale": self.scale(0, d_head)}

    def scale(self, layer: int, d_head: int) -> float:
        c = self.config
        s = d_head**-0.5 if getattr(c, "scale_attn_weights", True) else 1.0
        return s / (layer + 1) if getattr(c, "scale_attn_by_inverse_layer_idx", False) else s

    def layer_spec(self, layer: int) -> BlockSpec:
        return with_scale(super().layer_spec(layer), self.scale(layer, self._spec.d_head))

    def expected_shapes(self, block: str, layer: int) -> dict[str, tuple[int, ...]]:
        n, D = self.names(layer), self._spec.d_model
        shapes = {"qkv": (D, self.qkv_rows()), "o": (D, D), "bqkv": (self.qkv_rows(),), "bo": (D,),
                  "norm_w": (D,), "norm_b": (D,)}  # Conv1D: [in, out]
        return {n[r]: shape for r, shape in shapes.items()}

    def _build(self, layer: int, t: Mapping[str, Tensor]) -> AttentionLayer:
        return super()._build(layer, {**t, "qkv": t["qkv"].T})  # Conv1D [in, out] (D, 3D) -> Linear (3D, D)

    def out_heads(self, w: Tensor) -> Tensor:
        s = self._spec
        return w.reshape(s.n_heads, s.d_head, s.d_model)  # Conv1D [in, out] (H*d, D) -> (H, d, D)

    def layout(self, w: Tensor) -> Blocks:
        s = self._spec
        return sectioned(w, s.n_heads, s.n_heads, s.d_head)  # (3*H*d, ...) -> q, k, v (H, d, ...)
