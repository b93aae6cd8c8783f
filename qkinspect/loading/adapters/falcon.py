"""Falcon: one fused projection in one of three layouts, chosen by the config.

    h.{i}.self_attention.query_key_value.weight   rows, by layout:
        new_decoder_architecture (40B, 180B): (G*(rep+2)*d, D), interleaved per KV group
            (group, [rep queries, k, v], d), G = num_kv_heads, rep = H / G
        multi_query (7B):                      (H*d + 2*d, D), sectioned [q (all heads) | k | v], one KV head
        neither (RW-style multi-head):         (3*H*d, D), interleaved per head (head, [q, k, v], d)
    h.{i}.self_attention.dense.weight             (D, H*d)
    h.{i}.ln_attn or h.{i}.input_layernorm        LayerNorm feeding attention

RoPE over the whole head, or ALiBi when `alibi` is set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qkinspect.loading.adapters.fused import (
    Blocks,
    FusedQKVAdapter,
    interleaved_per_group,
    interleaved_per_head,
    sectioned,
)
from qkinspect.loading.adapters.registry import register

if TYPE_CHECKING:
    from torch import Tensor


@register
class FalconAdapter(FusedQKVAdapter):
    """Falcon: grouped (new decoder architecture), multi-query, or multi-head fused qkv.

    Example:
        >>> with open_model("path/to/falcon-7b") as m:  # doctest: +SKIP
        ...     m.info.blocks[0].n_kv_heads  # 1: multi-query
    """

    model_types = ("falcon",)

    def n_kv_heads(self) -> int:
        c = self.config
        if c.new_decoder_architecture:
            return c.num_kv_heads
        return 1 if c.multi_query else c.num_attention_heads

    def spec_fields(self, d_head: int) -> dict[str, Any]:
        return {"positional": "alibi"} if self.config.alibi else {"positional": "rope", "rotary_dims": d_head}

    def layer_extra(self, layer: int) -> dict[str, Any]:
        return {} if self.config.alibi else {"rotary_style": "half"}

    @property
    def norm_path(self) -> str:  # type: ignore[override]
        """Mirrors FalconDecoderLayer: ln_attn when the new architecture keeps two parallel norms."""
        c = self.config
        n_ln = c.num_ln_in_parallel_attn or (2 if c.new_decoder_architecture else None)
        return "ln_attn" if c.parallel_attn and n_ln == 2 else "input_layernorm"

    def layout(self, w: Tensor) -> Blocks:
        s, c = self._spec, self.config
        H, G, d = s.n_heads, s.n_kv_heads, s.d_head
        if c.new_decoder_architecture:
            return interleaved_per_group(w, G, H // G, d)  # (G*(rep+2)*d, ...) -> q (H, d, ...), k, v (G, d, ...)
        if c.multi_query:
            return sectioned(w, H, 1, d)  # (H*d + 2*d, ...) -> q (H, d, ...), k, v (1, d, ...)
        return interleaved_per_head(w, H, d)  # (H*3*d, ...) -> q, k, v (H, d, ...)
