"""GPT-J: separate bias-free q/k/v/out projections; RoPE on the first `rotary_dim` dims of each head, with
*interleaved* pairs (dims 2i and 2i+1 rotate together: `extra["rotary_style"] == "interleaved"`).

    h.{i}.ln_1.{weight,bias}                  LayerNorm feeding attention (and, in parallel, the MLP)
    h.{i}.attn.{q,k,v,out}_proj.weight (D, D)
"""

from __future__ import annotations

from typing import Any

from qkinspect.loading.adapters._decoder import SplitProjectionAdapter
from qkinspect.loading.adapters.registry import register


@register
class GPTJAdapter(SplitProjectionAdapter):
    """GPT-J: interleaved partial RoPE, LayerNorm input shared with the parallel MLP, no biases.

    Example:
        >>> with open_model("path/to/gpt-j") as m:  # doctest: +SKIP
        ...     m.info.blocks[0].rotary_dims  # config.rotary_dim, e.g. 64 of 256
    """

    model_types = ("gptj",)
    layer_path = "h.{i}"
    attn_path = "attn"
    proj = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}
    norm_path = "ln_1"
    norm_kind = "layernorm"
    rotary_style = "interleaved"

    def spec_fields(self, d_head: int) -> dict[str, Any]:
        return {"positional": "rope", "rotary_dims": self.config.rotary_dim or d_head}
