"""GPT-2: one fused Conv1D projection sectioned [q | k | v] by *columns*; learned absolute positions.

Conv1D stores [in, out] (the transpose of nn.Linear): ``y = x @ weight + bias``.

    h.{i}.ln_1.{weight,bias}          (D,)       LayerNorm feeding attention
    h.{i}.attn.c_attn.weight          (D, 3*D)   columns: D query, D key, D value
    h.{i}.attn.c_attn.bias            (3*D,)
    h.{i}.attn.c_proj.{weight,bias}   (D, D)     [in = H*d, out = D]

Scale: 1/sqrt(d_head), or 1 when `scale_attn_weights` is off, further divided by (layer + 1) when
`scale_attn_by_inverse_layer_idx` is on; then each layer's record carries its own spec with that scale.

With `add_cross_attention` every block also has a cross-attention (a second block, "cross", same heads and
scale; queries read the decoder stream through ``ln_cross_attn``, keys and values the raw encoder_hidden_states,
so `norm_kv` is None and --fold-ln refuses the block):

    h.{i}.ln_cross_attn.{weight,bias}          (D,)       LayerNorm feeding the queries
    h.{i}.crossattention.q_attn.{weight,bias}  (D, D)     Conv1D: queries
    h.{i}.crossattention.c_attn.{weight,bias}  (D, 2*D)   Conv1D: columns D key, D value
    h.{i}.crossattention.c_proj.{weight,bias}  (D, D)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from qkinspect.layer import AttentionLayer, BlockSpec
from qkinspect.loading.adapters._decoder import check_shapes, norm_from, with_scale
from qkinspect.loading.adapters.base import bias_heads, heads_in
from qkinspect.loading.adapters.fused import Blocks, FusedQKVAdapter, sectioned, to_heads
from qkinspect.loading.adapters.registry import register

if TYPE_CHECKING:
    from torch import Tensor

CROSS = "cross"


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

    def _self_shapes(self, layer: int) -> dict[str, tuple[int, ...]]:
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

    # -- cross-attention (add_cross_attention) ---------------------------------------------------------------

    def blocks(self) -> list[BlockSpec]:
        s = self._spec
        if not getattr(self.config, "add_cross_attention", False):
            return [s]
        return [s, replace(s, name=CROSS, d_model_kv=s.d_model)]

    def cross_names(self, layer: int) -> dict[str, str]:
        lp = self.layer_path.format(i=layer)
        a = f"{lp}.crossattention"
        return {"q": f"{a}.q_attn.weight", "kv": f"{a}.c_attn.weight", "o": f"{a}.c_proj.weight",
                "bq": f"{a}.q_attn.bias", "bkv": f"{a}.c_attn.bias", "bo": f"{a}.c_proj.bias",
                "norm_w": f"{lp}.ln_cross_attn.weight", "norm_b": f"{lp}.ln_cross_attn.bias"}

    def tensor_names(self, block: str, layer: int) -> list[str]:
        if block != CROSS:
            return super().tensor_names(block, layer)
        n = self.cross_names(layer)
        return [n["q"], n["kv"], n["o"]]

    def optional_names(self, block: str, layer: int) -> list[str]:
        if block != CROSS:
            return super().optional_names(block, layer)
        n = self.cross_names(layer)
        return [n[r] for r in ("bq", "bkv", "bo", "norm_w", "norm_b")]

    def output_names(self, block: str, layer: int) -> list[str]:
        if block != CROSS:
            return super().output_names(block, layer)
        n = self.cross_names(layer)
        return [n["o"], n["bo"]]

    def expected_shapes(self, block: str, layer: int) -> dict[str, tuple[int, ...]]:
        if block != CROSS:
            return self._self_shapes(layer)
        n, D = self.cross_names(layer), self._spec.d_model
        shapes = {"q": (D, D), "kv": (D, 2 * D), "o": (D, D), "bq": (D,), "bkv": (2 * D,), "bo": (D,),
                  "norm_w": (D,), "norm_b": (D,)}  # Conv1D: [in, out]
        return {n[r]: shape for r, shape in shapes.items()}

    def build(self, block: str, layer: int, tensors: Mapping[str, Tensor]) -> AttentionLayer:
        if block != CROSS:
            return super().build(block, layer, tensors)
        check_shapes(tensors, self.expected_shapes(block, layer))
        return self._cross(layer, {r: tensors.get(name) for r, name in self.cross_names(layer).items()})

    def _cross(self, layer: int, t: Mapping[str, Any]) -> AttentionLayer:
        s = self.layer_spec(layer)
        H, d = s.n_heads, s.d_head
        k, v = t["kv"].T.unflatten(0, (2, H, d))  # Conv1D (D, 2*H*d) -> rows (2*H*d, D) -> (2, H, d, D): [k | v]
        bk, bv = (None, None) if t["bkv"] is None else t["bkv"].unflatten(0, (2, H, d))  # (2*H*d,) -> (2, H, d)
        return AttentionLayer(
            spec=replace(s, name=CROSS, d_model_kv=s.d_model), layer=layer,
            W_Q=heads_in(t["q"].T, H, d),  # Conv1D [in, out] (D, H*d) -> Linear (H*d, D) -> (H, D, d)
            W_K=to_heads(k), W_V=to_heads(v),  # (H, d, D) -> (H, D, d)
            W_O=self.out_heads(t["o"]), b_Q=bias_heads(t["bq"], H, d), b_K=bk, b_V=bv, b_O=t["bo"],
            norm_q=norm_from(t, "layernorm"), norm_kv=None,  # keys/values read encoder_hidden_states as given
        )
