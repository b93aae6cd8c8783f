"""DistilBERT: BERT's post-LN encoder under its own names (q_lin/k_lin/v_lin/out_lin)."""

from __future__ import annotations

from qkinspect.layer import BlockSpec
from qkinspect.loading.adapters._projections import ProjectionAdapter, Projections, self_attention_spec
from qkinspect.loading.adapters.registry import register


@register
class DistilBertAdapter(ProjectionAdapter):
    """Layer i's attention reads layer i-1's ``output_layer_norm`` (layer 0: the embeddings' LayerNorm)."""

    model_types = ("distilbert",)

    def blocks(self) -> list[BlockSpec]:
        c = self.config
        return [self_attention_spec("encoder", c.n_layers, c.n_heads, c.dim)]

    def projections(self, block: str, layer: int) -> Projections:
        p = f"transformer.layer.{layer}.attention"
        norm = "embeddings.LayerNorm" if layer == 0 else f"transformer.layer.{layer - 1}.output_layer_norm"
        return Projections(f"{p}.q_lin", f"{p}.k_lin", f"{p}.v_lin", f"{p}.out_lin", norm)
