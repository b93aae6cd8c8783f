"""T5 (and mT5, UMT5): pre-RMSNorm encoder-decoder with unscaled scores and a learned relative bias."""

from __future__ import annotations

from dataclasses import replace

from qkinspect.layer import BlockSpec
from qkinspect.loading.adapters._projections import (
    ProjectionAdapter,
    Projections,
    encoder_only,
    self_attention_spec,
)
from qkinspect.loading.adapters.registry import register


@register
class T5Adapter(ProjectionAdapter):
    """Scores are q·k with no 1/sqrt(d) (scale 1.0: T5 folds it into the initialisation). Self-attention adds a
    bucketed relative bias ("relative"); cross-attention adds none ("none"). d_head is ``d_kv``, which need
    not be d_model / n_heads. Norms are T5's RMSNorm (``layer_norm``, gain only); cross-attention keys and
    values read the encoder's ``final_layer_norm``. T5EncoderModel checkpoints yield the encoder alone."""

    model_types = ("t5", "mt5", "umt5")
    norm_kind = "rmsnorm"

    def blocks(self) -> list[BlockSpec]:
        c = self.config
        n_dec = getattr(c, "num_decoder_layers", None) or c.num_layers
        enc = self_attention_spec("encoder", c.num_layers, c.num_heads, c.d_model, c.d_kv, positional="relative",
                                  scale=1.0)
        if encoder_only(c):
            return [enc]
        dec = replace(enc, name="decoder", n_layers=n_dec)
        return [enc, dec, replace(dec, name="cross", positional="none", d_model_kv=c.d_model)]

    def projections(self, block: str, layer: int) -> Projections:
        if block == "cross":
            s = f"decoder.block.{layer}.layer.1"
            a = f"{s}.EncDecAttention"
            return Projections(f"{a}.q", f"{a}.k", f"{a}.v", f"{a}.o", f"{s}.layer_norm",
                               "encoder.final_layer_norm", cross=True)
        s = f"{block}.block.{layer}.layer.0"
        a = f"{s}.SelfAttention"
        return Projections(f"{a}.q", f"{a}.k", f"{a}.v", f"{a}.o", f"{s}.layer_norm")
