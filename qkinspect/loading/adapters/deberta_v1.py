"""DeBERTa (v1: microsoft/deberta-base, deberta-large): post-LN encoder, one fused ``in_proj`` interleaved per head.

    encoder.layer.{i}.attention.self.in_proj.weight    (3*H*d, D)  nn.Linear, no bias; rows (head, 3, d): q, k, v
    encoder.layer.{i}.attention.self.q_bias            (H*d,)      added to the queries, head-major
    encoder.layer.{i}.attention.self.v_bias            (H*d,)      added to the values; keys have no bias
    encoder.layer.{i}.attention.output.dense.{weight,bias}

``DisentangledSelfAttention.forward`` views the fused output as (B, T, H, 3d) and chunks its last dimension into
q, k, v: the interleaved-per-head layout of `fused`. W_Q/W_K describe the content-to-content term; with
``relative_attention`` the c2p/p2c terms are added to it. Every term is divided by sqrt(d * (1 + len(pos_att_type)))
(DeBERTa v1 counts every entry of pos_att_type, unlike v2). ``talking_head`` mixes the heads' scores and
probabilities (a learned H x H map): the per-head forms are those before mixing, flagged as attention_kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from qkinspect.layer import AttentionLayer, BlockSpec, Norm
from qkinspect.loading.adapters._decoder import check_shapes
from qkinspect.loading.adapters._projections import self_attention_spec
from qkinspect.loading.adapters.base import Adapter, bias_heads, heads_out
from qkinspect.loading.adapters.fused import interleaved_per_head, to_heads
from qkinspect.loading.adapters.registry import register

if TYPE_CHECKING:
    from torch import Tensor


@register
class DebertaAdapter(Adapter):
    """DeBERTa v1: a layer's attention reads the previous layer's output LayerNorm (layer 0: the embeddings').

    Example:
        >>> with open_model("path/to/deberta-base") as m:  # doctest: +SKIP
        ...     next(m.layers()).W_Q.shape  # (12, 768, 64)
    """

    model_types = ("deberta",)

    def blocks(self) -> list[BlockSpec]:
        c = self.config
        H, D = c.num_attention_heads, c.hidden_size
        pos_att = list(getattr(c, "pos_att_type", None) or [])
        relative = bool(getattr(c, "relative_attention", False))
        talking = bool(getattr(c, "talking_head", False))
        return [self_attention_spec("encoder", c.num_hidden_layers, H, D,
                                    positional="relative" if relative else "absolute",
                                    scale=(D // H * (1 + len(pos_att))) ** -0.5,
                                    attention_kind="talking-heads" if talking else "full")]

    def _names(self, layer: int) -> dict[str, str]:
        a = f"encoder.layer.{layer}.attention"
        norm = "embeddings.LayerNorm" if layer == 0 else f"encoder.layer.{layer - 1}.output.LayerNorm"
        return {"qkv": f"{a}.self.in_proj.weight", "bq": f"{a}.self.q_bias", "bv": f"{a}.self.v_bias",
                "o": f"{a}.output.dense.weight", "bo": f"{a}.output.dense.bias",
                "norm_w": f"{norm}.weight", "norm_b": f"{norm}.bias"}

    def tensor_names(self, block: str, layer: int) -> list[str]:
        n = self._names(layer)
        return [n["qkv"], n["bq"], n["bv"], n["o"]]

    def optional_names(self, block: str, layer: int) -> list[str]:
        n = self._names(layer)
        return [n["bo"], n["norm_w"], n["norm_b"]]

    def output_names(self, block: str, layer: int) -> list[str]:
        n = self._names(layer)
        return [n["o"], n["bo"]]

    def expected_shapes(self, block: str, layer: int) -> dict[str, tuple[int, ...]]:
        s, n = self.spec("encoder"), self._names(layer)
        D, Hd = s.d_model, s.n_heads * s.d_head
        shapes = {"qkv": (3 * Hd, D), "bq": (Hd,), "bv": (Hd,), "o": (D, Hd), "bo": (D,), "norm_w": (D,),
                  "norm_b": (D,)}
        return {n[r]: shape for r, shape in shapes.items()}

    def build(self, block: str, layer: int, tensors: Mapping[str, Tensor]) -> AttentionLayer:
        check_shapes(tensors, self.expected_shapes(block, layer))
        s, n = self.spec("encoder"), self._names(layer)
        t: dict[str, Any] = {r: tensors.get(name) for r, name in n.items()}
        H, d = s.n_heads, s.d_head
        wq, wk, wv = interleaved_per_head(t["qkv"], H, d)  # (3*H*d, D) -> q, k, v each (H, d, D)
        norm = None if t["norm_w"] is None else Norm("layernorm", t["norm_w"], t["norm_b"])
        return AttentionLayer(
            spec=s, layer=layer,
            W_Q=to_heads(wq), W_K=to_heads(wk), W_V=to_heads(wv),  # (H, d, D) -> (H, D, d)
            W_O=heads_out(t["o"], H, d),  # (D, H*d) -> (H, d, D)
            b_Q=bias_heads(t["bq"], H, d), b_V=bias_heads(t["bv"], H, d),  # (H*d,) -> (H, d)
            b_O=t["bo"], norm_q=norm, norm_kv=norm,
        )
