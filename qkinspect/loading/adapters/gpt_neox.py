"""GPT-NeoX (Pythia, GPT-NeoX-20B): one fused projection interleaved per head.

    layers.{i}.input_layernorm.{weight,bias}                LayerNorm feeding attention
    layers.{i}.attention.query_key_value.{weight,bias}      (3*D, D): rows (head, [q, k, v], d)
    layers.{i}.attention.dense.{weight,bias}                (D, D)

RoPE (rotate-half) on the first rotary_pct * d_head dims of each head.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qkinspect.loading.adapters._decoder import rope_spec
from qkinspect.loading.adapters.fused import Blocks, FusedQKVAdapter, interleaved_per_head
from qkinspect.loading.adapters.registry import register

if TYPE_CHECKING:
    from torch import Tensor


@register
class GPTNeoXAdapter(FusedQKVAdapter):
    """GPT-NeoX: fused qkv interleaved per head [(head, 3, d_head)], partial RoPE.

    Example:
        >>> with open_model("path/to/pythia-70m") as m:  # doctest: +SKIP
        ...     m.info.blocks[0].rotary_dims  # 16 of d_head 64 (rotary_pct 0.25)
    """

    model_types = ("gpt_neox",)
    layer_path = "layers.{i}"
    attn_path = "attention"

    def spec_fields(self, d_head: int) -> dict[str, Any]:
        return rope_spec(self.config, d_head)

    def layer_extra(self, layer: int) -> dict[str, Any]:
        return {"rotary_style": "half"}

    def layout(self, w: Tensor) -> Blocks:
        s = self._spec
        return interleaved_per_head(w, s.n_heads, s.d_head)  # (H*3*d, ...) -> q, k, v (H, d, ...)
