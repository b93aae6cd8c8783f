"""OPT: separate biased q/k/v/out projections under ``decoder.layers.{i}.self_attn``; learned absolute positions.

Most OPT models normalise before attention (`self_attn_layer_norm`); OPT-350m (`do_layer_norm_before=False`)
normalises after, so its attention reads the previous layer's `final_layer_norm` output (layer 0: embeddings).
"""

from __future__ import annotations

from typing import Any

from qkinspect.loading.adapters._decoder import SplitProjectionAdapter
from qkinspect.loading.adapters.registry import register


@register
class OptAdapter(SplitProjectionAdapter):
    """OPT. The model multiplies q_proj's output (bias included) by head_dim ** -0.5 before the dot product;
    that is the default score scale, so W_Q and b_Q are kept as stored.

    Example:
        >>> with open_model("path/to/opt") as m:  # doctest: +SKIP
        ...     next(m.layers()).b_Q.shape  # (n_heads, d_head)
    """

    model_types = ("opt",)
    layer_path = "decoder.layers.{i}"
    proj = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}
    norm_path = "self_attn_layer_norm"
    norm_kind = "layernorm"

    def spec_fields(self, d_head: int) -> dict[str, Any]:
        return {"positional": "absolute"}

    def names(self, layer: int) -> dict[str, str]:
        n = super().names(layer)
        if not getattr(self.config, "do_layer_norm_before", True):
            del n["norm_w"], n["norm_b"]
            if layer > 0:  # post-LN: the previous layer's last norm feeds this attention
                prev = f"{self.layer_path.format(i=layer - 1)}.final_layer_norm"
                n.update(norm_w=f"{prev}.weight", norm_b=f"{prev}.bias")
        return n
