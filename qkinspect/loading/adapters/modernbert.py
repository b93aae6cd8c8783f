"""ModernBERT: pre-LN encoder, fused Wqkv sectioned [q | k | v], rotary positions, global and sliding layers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from qkinspect.layer import AttentionLayer, BlockSpec, Norm
from qkinspect.loading.adapters._projections import self_attention_spec
from qkinspect.loading.adapters.base import Adapter, bias_heads, heads_in, heads_out
from qkinspect.loading.adapters.registry import register

if TYPE_CHECKING:
    from torch import Tensor


def split_sections(w: Tensor, n: int, d: int) -> tuple[Tensor, Tensor, Tensor]:
    """Fused [q | k | v] rows (3*n*d, ...) -> three (n*d, ...) blocks, as the model's ``view(3, n, d)`` splits them."""
    q, k, v = w.reshape(3, n * d, *w.shape[1:])  # (3*n*d, ...) -> (3, n*d, ...)
    return q, k, v


@register
class ModernBertAdapter(Adapter):
    """Layer types come from ``config.layer_types`` ("full_attention" or "sliding_attention"; older configs:
    every `global_attn_every_n_layers`-th layer is global). Each layer's record carries the block spec refined
    for its kind (attention_kind "sliding" for local layers) and its rotary base and window in `extra`; the
    block-level spec says "full+sliding" when both occur. Layer 0 reads the embeddings' LayerNorm (its own
    attn_norm is an identity); later layers read their ``attn_norm``. Biases only with attention_bias."""

    model_types = ("modernbert",)

    def _kinds(self) -> list[str]:
        c = self.config
        kinds = getattr(c, "layer_types", None)
        if kinds:
            return list(kinds)
        every = getattr(c, "global_attn_every_n_layers", 1) or 1
        return ["sliding_attention" if i % every else "full_attention" for i in range(c.num_hidden_layers)]

    def blocks(self) -> list[BlockSpec]:
        c = self.config
        kinds = sorted({"sliding" if k == "sliding_attention" else "full" for k in self._kinds()})
        d = c.hidden_size // c.num_attention_heads
        return [self_attention_spec("encoder", c.num_hidden_layers, c.num_attention_heads, c.hidden_size,
                                    positional="rope", rotary_dims=d, attention_kind="+".join(kinds))]

    def layer_spec(self, layer: int) -> BlockSpec:
        sliding = self._kinds()[layer] == "sliding_attention"
        return replace(self.spec("encoder"), attention_kind="sliding" if sliding else "full")

    def _extra(self, layer: int) -> dict[str, Any]:
        c, kind = self.config, self._kinds()[layer]
        out: dict[str, Any] = {}
        params = (getattr(c, "rope_parameters", None) or {}).get(kind) or {}
        if "rope_theta" in params:
            out["rope_theta"] = params["rope_theta"]
        if kind == "sliding_attention":
            out["window"] = getattr(c, "local_attention", None)
        return out

    def _names(self, layer: int) -> tuple[str, str, str]:
        norm = "embeddings.norm" if layer == 0 else f"layers.{layer}.attn_norm"
        return f"layers.{layer}.attn.Wqkv", f"layers.{layer}.attn.Wo", norm

    def tensor_names(self, block: str, layer: int) -> list[str]:
        qkv, o, _ = self._names(layer)
        return [f"{qkv}.weight", f"{o}.weight"]

    def optional_names(self, block: str, layer: int) -> list[str]:
        qkv, o, norm = self._names(layer)
        return [f"{qkv}.bias", f"{o}.bias", f"{norm}.weight", f"{norm}.bias"]

    def expected_shapes(self, block: str, layer: int) -> dict[str, tuple[int, ...]]:
        qkv, o, _ = self._names(layer)
        D = self.config.hidden_size
        return {f"{qkv}.weight": (3 * D, D), f"{o}.weight": (D, D)}

    def build(self, block: str, layer: int, tensors: Mapping[str, Tensor]) -> AttentionLayer:
        s = self.layer_spec(layer)
        H, d = s.n_heads, s.d_head
        qkv, o, norm_name = self._names(layer)
        wq, wk, wv = split_sections(tensors[f"{qkv}.weight"], H, d)  # each (H*d, D)
        b = tensors.get(f"{qkv}.bias")
        bq, bk, bv = split_sections(b, H, d) if b is not None else (None, None, None)  # each (H*d,)
        w = tensors.get(f"{norm_name}.weight")
        norm = None if w is None else Norm("layernorm", w, tensors.get(f"{norm_name}.bias"))
        return AttentionLayer(
            spec=s, layer=layer,
            W_Q=heads_in(wq, H, d), W_K=heads_in(wk, H, d), W_V=heads_in(wv, H, d),  # (H*d, D) -> (H, D, d)
            W_O=heads_out(tensors[f"{o}.weight"], H, d),  # (D, H*d) -> (H, d, D)
            b_Q=bias_heads(bq, H, d), b_K=bias_heads(bk, H, d), b_V=bias_heads(bv, H, d),
            b_O=tensors.get(f"{o}.bias"),
            norm_q=norm, norm_kv=norm, extra=self._extra(layer),
        )
