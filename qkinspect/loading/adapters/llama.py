"""Llama and the decoders that keep its tensor names (Mistral, Mixtral): separate q/k/v/o projections.

Layout (``model.`` prefix found by the tensor source)::

    layers.{i}.input_layernorm.weight        (D,)        RMSNorm gain feeding attention
    layers.{i}.self_attn.q_proj.weight       (H*d, D)    nn.Linear [out, in]
    layers.{i}.self_attn.{k,v}_proj.weight   (G*d, D)    grouped-query: G = num_key_value_heads
    layers.{i}.self_attn.o_proj.weight       (D, H*d)

The GGUF source maps llama.cpp's tensors onto these names and loads through this adapter.
"""

from __future__ import annotations

from qkinspect.loading.adapters._decoder import SplitProjectionAdapter
from qkinspect.loading.adapters.registry import register


@register
class LlamaAdapter(SplitProjectionAdapter):
    """Llama, Mistral, Mixtral: RMSNorm, RoPE (rotate-half), grouped-query attention, no biases by default.

    Example:
        >>> from qkinspect.loading import open_model
        >>> with open_model("path/to/llama") as m:  # doctest: +SKIP
        ...     layer = next(m.layers())
        ...     layer.W_K.shape  # (n_kv_heads, d_model, d_head): grouped, never tiled
    """

    model_types = ("llama", "mistral", "mixtral")
