"""ViT (and DeiT, which keeps its names): a pre-LN encoder over image patches."""

from __future__ import annotations

from qkinspect.layer import BlockSpec
from qkinspect.loading.adapters._projections import ProjectionAdapter, Projections, self_attention_spec
from qkinspect.loading.adapters.registry import register


@register
class ViTAdapter(ProjectionAdapter):
    """Names as checkpoints store them (``encoder.layer.i.attention.attention.query``), which transformers 5
    still writes on save even though its modules are now called ``layers.i.attention.q_proj``."""

    model_types = ("vit", "deit")

    def blocks(self) -> list[BlockSpec]:
        c = self.config
        return [self_attention_spec("encoder", c.num_hidden_layers, c.num_attention_heads, c.hidden_size)]

    def projections(self, block: str, layer: int) -> Projections:
        p = f"encoder.layer.{layer}"
        a = f"{p}.attention.attention"
        return Projections(f"{a}.query", f"{a}.key", f"{a}.value", f"{p}.attention.output.dense",
                           f"{p}.layernorm_before")
