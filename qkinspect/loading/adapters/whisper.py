"""Whisper: a pre-LN encoder-decoder (audio encoder, text decoder); its k_proj layers have no bias."""

from __future__ import annotations

from qkinspect.loading.adapters._seq2seq import Seq2SeqAdapter
from qkinspect.loading.adapters.registry import register


@register
class WhisperAdapter(Seq2SeqAdapter):
    """Cross-attention keys and values read the encoder's final ``layer_norm``."""

    model_types = ("whisper",)
    pre_ln = True
