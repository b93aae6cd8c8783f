"""BLOOM: one fused projection interleaved per head, like GPT-NeoX; ALiBi instead of position embeddings.

    h.{i}.input_layernorm.{weight,bias}                   LayerNorm feeding attention
    h.{i}.self_attention.query_key_value.{weight,bias}    (3*D, D): rows (head, [q, k, v], d)
    h.{i}.self_attention.dense.{weight,bias}              (D, D)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qkinspect.loading.adapters.fused import Blocks, FusedQKVAdapter, interleaved_per_head
from qkinspect.loading.adapters.registry import register

if TYPE_CHECKING:
    from torch import Tensor


@register
class BloomAdapter(FusedQKVAdapter):
    """BLOOM: fused qkv interleaved per head; ALiBi; scale 1/sqrt(d_head).

    Example:
        >>> with open_model("path/to/bloom-560m") as m:  # doctest: +SKIP
        ...     m.info.blocks[0].positional  # "alibi"
    """

    model_types = ("bloom",)

    def spec_fields(self, d_head: int) -> dict[str, Any]:
        return {"positional": "alibi"}

    def layout(self, w: Tensor) -> Blocks:
        s = self._spec
        return interleaved_per_head(w, s.n_heads, s.d_head)  # (H*3*d, ...) -> q, k, v (H, d, ...)
