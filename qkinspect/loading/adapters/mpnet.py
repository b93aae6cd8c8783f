"""MPNet: a post-LN BERT-like encoder with a relative position bias added to every layer's scores."""

from __future__ import annotations

from qkinspect.layer import BlockSpec
from qkinspect.loading.adapters._projections import ProjectionAdapter, Projections, self_attention_spec
from qkinspect.loading.adapters.registry import register


@register
class MPNetAdapter(ProjectionAdapter):
    """Positional "relative": MPNet adds a bucketed relative bias to q·k (besides absolute position embeddings)."""

    model_types = ("mpnet",)

    def blocks(self) -> list[BlockSpec]:
        c = self.config
        return [self_attention_spec("encoder", c.num_hidden_layers, c.num_attention_heads, c.hidden_size,
                                    positional="relative")]

    def projections(self, block: str, layer: int) -> Projections:
        p = f"encoder.layer.{layer}.attention"
        norm = "embeddings.LayerNorm" if layer == 0 else f"encoder.layer.{layer - 1}.output.LayerNorm"
        return Projections(f"{p}.attn.q", f"{p}.attn.k", f"{p}.attn.v", f"{p}.attn.o", norm)
