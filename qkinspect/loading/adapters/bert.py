"""BERT and its close relatives that keep BERT's tensor names (RoBERTa, XLM-RoBERTa, ELECTRA)."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from qkinspect.layer import AttentionLayer, BlockSpec, Norm
from qkinspect.loading.adapters.base import Adapter, bias_heads, heads_in, heads_out
from qkinspect.loading.adapters.registry import register


@register
class BertAdapter(Adapter):
    model_types = ("bert", "roberta", "xlm-roberta", "electra", "camembert")

    def blocks(self) -> list[BlockSpec]:
        c = self.config
        pos = getattr(c, "position_embedding_type", "absolute") or "absolute"
        return [
            BlockSpec(
                name="encoder",
                n_layers=c.num_hidden_layers,
                n_heads=c.num_attention_heads,
                n_kv_heads=c.num_attention_heads,
                d_model=c.hidden_size,
                d_head=c.hidden_size // c.num_attention_heads,
                positional="absolute" if pos == "absolute" else "relative",
            )
        ]

    def _p(self, layer: int) -> str:
        return f"encoder.layer.{layer}.attention"

    def tensor_names(self, block: str, layer: int) -> list[str]:
        p = self._p(layer)
        return [f"{p}.self.query.weight", f"{p}.self.key.weight", f"{p}.self.value.weight",
                f"{p}.output.dense.weight"]

    def _norm_prefix(self, layer: int) -> str:
        # Post-LN: the attention input is the previous sublayer's LayerNorm output.
        return "embeddings.LayerNorm" if layer == 0 else f"encoder.layer.{layer - 1}.output.LayerNorm"

    def optional_names(self, block: str, layer: int) -> list[str]:
        p, n = self._p(layer), self._norm_prefix(layer)
        return [f"{p}.self.query.bias", f"{p}.self.key.bias", f"{p}.self.value.bias",
                f"{p}.output.dense.bias", f"{n}.weight", f"{n}.bias"]

    def expected_shapes(self, block: str, layer: int) -> dict[str, tuple[int, ...]]:
        D = self.config.hidden_size
        return {name: (D, D) for name in self.tensor_names(block, layer)}

    def build(self, block: str, layer: int, tensors: Mapping[str, Tensor]) -> AttentionLayer:
        s = self.spec(block)
        H, d = s.n_heads, s.d_head
        p, n = self._p(layer), self._norm_prefix(layer)
        t = tensors.get
        norm = None
        if t(f"{n}.weight") is not None:
            norm = Norm("layernorm", t(f"{n}.weight"), t(f"{n}.bias"))
        return AttentionLayer(
            spec=s,
            layer=layer,
            W_Q=heads_in(t(f"{p}.self.query.weight"), H, d),  # (H*d, D) -> (H, D, d)
            W_K=heads_in(t(f"{p}.self.key.weight"), H, d),
            W_V=heads_in(t(f"{p}.self.value.weight"), H, d),
            W_O=heads_out(t(f"{p}.output.dense.weight"), H, d),  # (D, H*d) -> (H, d, D)
            b_Q=bias_heads(t(f"{p}.self.query.bias"), H, d),
            b_K=bias_heads(t(f"{p}.self.key.bias"), H, d),
            b_V=bias_heads(t(f"{p}.self.value.bias"), H, d),
            b_O=t(f"{p}.output.dense.bias"),
            norm_q=norm,
            norm_kv=norm,
        )
