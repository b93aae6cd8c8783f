"""BART and Marian: post-LN encoder-decoders (see `_seq2seq` for blocks and norms)."""

from __future__ import annotations

from qkinspect.loading.adapters._seq2seq import Seq2SeqAdapter
from qkinspect.loading.adapters.registry import register


@register
class BartAdapter(Seq2SeqAdapter):
    """BART normalises its embeddings (``layernorm_embedding``) before the first layer of each stack."""

    model_types = ("bart",)
    embedding_norm = True


@register
class MarianAdapter(Seq2SeqAdapter):
    """Marian has no embedding LayerNorm: layer 0 of each stack reads the scaled embeddings directly."""

    model_types = ("marian",)
