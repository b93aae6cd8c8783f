"""Reformer: LSH attention layers (one shared query_key matrix) and local attention layers, interleaved."""

from __future__ import annotations

from dataclasses import replace

from qkinspect.layer import BlockSpec
from qkinspect.loading.adapters._projections import ProjectionAdapter, Projections, self_attention_spec
from qkinspect.loading.adapters.registry import register


@register
class ReformerAdapter(ProjectionAdapter):
    """``config.attn_layers`` says per layer "lsh" or "local". LSH layers project queries and keys with one
    ``query_key`` matrix, so W_K is W_Q (shared_qk) and the model length-normalises the keys before q·k
    (``extra["key_normalised"]``); local layers have their own query, key and value.

    Per-layer flags: each layer's record carries the block spec refined for its kind (`layer_spec`:
    attention_kind "lsh" with shared_qk, or "local"). The block-level spec in ModelInfo summarises: its
    attention_kind is "lsh", "local" or "local+lsh" for a mix, and shared_qk is set only when every layer is LSH.
    """

    model_types = ("reformer",)

    def _kinds(self) -> list[str]:
        return list(self.config.attn_layers)

    def blocks(self) -> list[BlockSpec]:
        c, kinds = self.config, self._kinds()
        present = sorted(set(kinds))
        return [self_attention_spec("encoder", len(kinds), c.num_attention_heads, c.hidden_size,
                                    c.attention_head_size, attention_kind="+".join(present),
                                    shared_qk=present == ["lsh"])]

    def layer_spec(self, block: str, layer: int) -> BlockSpec:
        kind = self._kinds()[layer]
        return replace(self.spec(block), attention_kind=kind, shared_qk=kind == "lsh")

    def layer_extra(self, block: str, layer: int) -> dict:
        return {"key_normalised": True} if self._kinds()[layer] == "lsh" else {}

    def projections(self, block: str, layer: int) -> Projections:
        p = f"encoder.layers.{layer}.attention"
        a = f"{p}.self_attention"
        q, k = (f"{a}.query_key",) * 2 if self._kinds()[layer] == "lsh" else (f"{a}.query", f"{a}.key")
        return Projections(q, k, f"{a}.value", f"{p}.output.dense", f"{p}.layer_norm")
