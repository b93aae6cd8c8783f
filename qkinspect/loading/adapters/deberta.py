"""DeBERTa-v2/v3: post-LN encoder with disentangled (content/position) attention."""

from __future__ import annotations

from qkinspect.layer import BlockSpec
from qkinspect.loading.adapters._projections import ProjectionAdapter, Projections, self_attention_spec
from qkinspect.loading.adapters.registry import register


@register
class DebertaV2Adapter(ProjectionAdapter):
    """The content-to-content term q·k is what W_Q, W_K describe; the relative (c2p, p2c) terms are added
    to it. DeBERTa divides every term by sqrt(d_head * (1 + number of pos_att_type)), recorded as `scale`.
    With ``conv_kernel_size > 0`` layer 1 reads the output of the convolution's LayerNorm."""

    model_types = ("deberta-v2",)

    def blocks(self) -> list[BlockSpec]:
        c = self.config
        d = getattr(c, "attention_head_size", None) or c.hidden_size // c.num_attention_heads
        pos_att = [t for t in (getattr(c, "pos_att_type", None) or []) if t in ("c2p", "p2c")]
        relative = bool(getattr(c, "relative_attention", False))
        return [self_attention_spec("encoder", c.num_hidden_layers, c.num_attention_heads, c.hidden_size, d,
                                    positional="relative" if relative else "absolute",
                                    scale=(d * (1 + len(pos_att))) ** -0.5)]

    def _norm_prefix(self, layer: int) -> str:
        if layer == 0:
            return "embeddings.LayerNorm"
        if layer == 1 and (getattr(self.config, "conv_kernel_size", 0) or 0) > 0:
            return "encoder.conv.LayerNorm"
        return f"encoder.layer.{layer - 1}.output.LayerNorm"

    def projections(self, block: str, layer: int) -> Projections:
        p = f"encoder.layer.{layer}.attention"
        return Projections(f"{p}.self.query_proj", f"{p}.self.key_proj", f"{p}.self.value_proj",
                           f"{p}.output.dense", self._norm_prefix(layer))
