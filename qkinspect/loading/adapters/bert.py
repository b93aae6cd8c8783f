"""BERT and its close relatives that keep BERT's tensor names (RoBERTa, XLM-RoBERTa, ELECTRA, CamemBERT)."""

from __future__ import annotations

from qkinspect.layer import BlockSpec
from qkinspect.loading.adapters._projections import ProjectionAdapter, Projections, self_attention_spec
from qkinspect.loading.adapters.registry import register


@register
class BertAdapter(ProjectionAdapter):
    """Post-LN encoder: a layer's attention reads the previous layer's output LayerNorm (layer 0: the embeddings',
    unless ELECTRA's embedding projection stands between them)."""

    model_types = ("bert", "roberta", "xlm-roberta", "electra", "camembert")

    def blocks(self) -> list[BlockSpec]:
        c = self.config
        pos = getattr(c, "position_embedding_type", "absolute") or "absolute"
        return [self_attention_spec("encoder", c.num_hidden_layers, c.num_attention_heads, c.hidden_size,
                                    positional="absolute" if pos == "absolute" else "relative")]

    def _norm_prefix(self, layer: int) -> str | None:
        if layer > 0:
            return f"encoder.layer.{layer - 1}.output.LayerNorm"
        # ELECTRA projects its embeddings (embedding_size) to the hidden size after their LayerNorm.
        width = getattr(self.config, "embedding_size", None)
        return None if width not in (None, self.config.hidden_size) else "embeddings.LayerNorm"

    def projections(self, block: str, layer: int) -> Projections:
        p = f"encoder.layer.{layer}.attention"
        norm = self._norm_prefix(layer)
        return Projections(f"{p}.self.query", f"{p}.self.key", f"{p}.self.value", f"{p}.output.dense", norm)
