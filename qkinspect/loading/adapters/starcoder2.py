"""StarCoder2: Llama's tensor names with a LayerNorm (gain and bias) before attention and biases on every projection
(``use_bias``, read when present); grouped-query attention; RoPE over the whole head; an optional sliding window
on every layer (``sliding_window``: attention kind "sliding")."""

from __future__ import annotations

from qkinspect.loading.adapters._decoder import SplitProjectionAdapter
from qkinspect.loading.adapters.registry import register


@register
class Starcoder2Adapter(SplitProjectionAdapter):
    """StarCoder2 (bigcode/starcoder2-*): LayerNorm ``input_layernorm``; q/k/v/o biases.

    Example:
        >>> with open_model("path/to/starcoder2") as m:  # doctest: +SKIP
        ...     next(m.layers()).norm_q.kind  # 'layernorm'
    """

    model_types = ("starcoder2",)
    norm_kind = "layernorm"
