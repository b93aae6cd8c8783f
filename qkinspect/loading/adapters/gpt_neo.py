"""GPT-Neo: separate q/k/v projections without biases, and no score scaling at all (scale = 1.0).

    h.{i}.ln_1.{weight,bias}                          LayerNorm feeding attention
    h.{i}.attn.attention.{q,k,v}_proj.weight  (D, D)  nn.Linear, no bias
    h.{i}.attn.attention.out_proj.{weight,bias}

Layers alternate global and local (sliding-window) attention: each layer's spec says "full" or "local"
(`attention_kind`; the block summary is "full+local"), and `extra["window_size"]` gives a local layer's window.
"""

from __future__ import annotations

from typing import Any

from qkinspect.loading.adapters._decoder import SplitProjectionAdapter
from qkinspect.loading.adapters.registry import register


@register
class GPTNeoAdapter(SplitProjectionAdapter):
    """GPT-Neo: absolute positions, scale 1.0 (the model never divides by sqrt(d_head)).

    Example:
        >>> with open_model("path/to/gpt-neo") as m:  # doctest: +SKIP
        ...     m.info.blocks[0].score_scale  # 1.0
    """

    model_types = ("gpt_neo",)
    layer_path = "h.{i}"
    attn_path = "attn.attention"
    proj = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}
    norm_path = "ln_1"
    norm_kind = "layernorm"

    def spec_fields(self, d_head: int) -> dict[str, Any]:
        kinds = {self.layer_kind(i) for i in range(self.config.num_layers)}
        return {"positional": "absolute", "scale": 1.0, "attention_kind": "+".join(sorted(kinds))}

    def layer_kind(self, layer: int) -> str:
        return "local" if self.config.attention_layers[layer] == "local" else "full"

    def layer_extra(self, layer: int) -> dict[str, Any]:
        kind = self.config.attention_layers[layer]
        extra: dict[str, Any] = {"layer_type": kind}
        if kind == "local":
            extra["window_size"] = self.config.window_size  # a query sees itself and the window_size - 1 before it
        return extra
