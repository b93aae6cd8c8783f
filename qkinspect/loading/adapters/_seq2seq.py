"""Shared layout of BART-style encoder-decoders (BART, Marian, Whisper): ``{encoder,decoder}.layers.i.self_attn``
and ``decoder.layers.i.encoder_attn`` with q_proj/k_proj/v_proj/out_proj. No @register here."""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from qkinspect.layer import BlockSpec
from qkinspect.loading.adapters._projections import (
    ProjectionAdapter,
    Projections,
    encoder_only,
    self_attention_spec,
)


class Seq2SeqAdapter(ProjectionAdapter):
    """Blocks "encoder", "decoder" (self-attention) and "cross" (queries from the decoder stream, keys and
    values from the encoder output).

    Norms (for --fold-ln): pre-LN models read the layer's own ``self_attn_layer_norm`` (cross:
    ``encoder_attn_layer_norm``; keys/values: the encoder's final ``layer_norm``). Post-LN models read the
    previous layer's ``final_layer_norm`` (layer 0: ``layernorm_embedding`` where the model has one, else
    none); cross-attention queries read the same layer's ``self_attn_layer_norm``, and keys/values the last
    encoder layer's ``final_layer_norm``, which is what the encoder outputs.
    """

    pre_ln: ClassVar[bool] = False
    embedding_norm: ClassVar[bool] = False  # BART's layernorm_embedding

    def blocks(self) -> list[BlockSpec]:
        c = self.config
        enc = self_attention_spec("encoder", c.encoder_layers, c.encoder_attention_heads, c.d_model)
        if encoder_only(c):
            return [enc]
        dec = self_attention_spec("decoder", c.decoder_layers, c.decoder_attention_heads, c.d_model)
        return [enc, dec, replace(dec, name="cross", d_model_kv=c.d_model)]

    def _input_norm(self, stack: str, layer: int) -> str | None:
        """The norm whose output a self-attention layer of `stack` ("encoder"/"decoder") reads."""
        if self.pre_ln:
            return f"{stack}.layers.{layer}.self_attn_layer_norm"
        if layer > 0:
            return f"{stack}.layers.{layer - 1}.final_layer_norm"
        return f"{stack}.layernorm_embedding" if self.embedding_norm else None

    def _encoder_output_norm(self) -> str:
        if self.pre_ln:
            return "encoder.layer_norm"
        return f"encoder.layers.{self.config.encoder_layers - 1}.final_layer_norm"

    def projections(self, block: str, layer: int) -> Projections:
        if block == "cross":
            a = f"decoder.layers.{layer}.encoder_attn"
            sub = "encoder_attn_layer_norm" if self.pre_ln else "self_attn_layer_norm"
            return Projections(f"{a}.q_proj", f"{a}.k_proj", f"{a}.v_proj", f"{a}.out_proj",
                               f"decoder.layers.{layer}.{sub}", self._encoder_output_norm(), cross=True)
        a = f"{block}.layers.{layer}.self_attn"
        return Projections(f"{a}.q_proj", f"{a}.k_proj", f"{a}.v_proj", f"{a}.out_proj",
                           self._input_norm(block, layer))
