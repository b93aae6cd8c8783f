"""mBART: BART's tensor names, but pre-LN (see `_seq2seq` for blocks and norms).

Each self-attention reads its own ``self_attn_layer_norm``; cross-attention queries read
``encoder_attn_layer_norm`` and its keys/values the encoder output, which mBART passes through the encoder's
final ``encoder.layer_norm``. Its ``layernorm_embedding`` feeds layer 0's residual stream, not its attention.
"""

from __future__ import annotations

from qkinspect.loading.adapters._seq2seq import Seq2SeqAdapter
from qkinspect.loading.adapters.registry import register


@register
class MBartAdapter(Seq2SeqAdapter):
    """mBART (facebook/mbart-large-50 ...): pre-LN BART.

    Example:
        >>> with open_model("path/to/mbart") as m:  # doctest: +SKIP
        ...     [b.key for b in m.info.blocks]  # ['encoder', 'decoder', 'cross']
    """

    model_types = ("mbart",)
    pre_ln = True
