"""Pegasus: BART's tensor names, pre-LN like mBART, with sinusoidal (fixed, absolute) positions.

Norms as mBART's (see `_seq2seq`): ``self_attn_layer_norm``, ``encoder_attn_layer_norm`` for cross queries, and
the encoder's final ``encoder.layer_norm`` for cross keys/values.
"""

from __future__ import annotations

from qkinspect.loading.adapters._seq2seq import Seq2SeqAdapter
from qkinspect.loading.adapters.registry import register


@register
class PegasusAdapter(Seq2SeqAdapter):
    """Pegasus (google/pegasus-*): pre-LN encoder-decoder; positions are added to the embeddings ("absolute").

    Example:
        >>> with open_model("path/to/pegasus") as m:  # doctest: +SKIP
        ...     m.info.block("cross").d_model_kv  # the encoder width
    """

    model_types = ("pegasus",)
    pre_ln = True
