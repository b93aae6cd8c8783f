"""Phi (1, 1.5, 2) and Phi-3.

Phi: separate biased q/k/v projections, output `dense`, a LayerNorm feeding attention (and the parallel MLP),
partial RoPE (`partial_rotary_factor`), and optional per-head LayerNorms on q and k (`qk_layernorm`).

Phi-3: one fused projection, sectioned [q | k | v] along its output rows::

    layers.{i}.self_attn.qkv_proj.weight   (H*d + 2*G*d, D)   rows: H*d query, G*d key, G*d value
    layers.{i}.self_attn.o_proj.weight     (D, H*d)
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from qkinspect.layer import AttentionLayer
from qkinspect.loading.adapters.base import bias_heads, heads_in, heads_out
from qkinspect.loading.adapters.llama import SplitProjectionAdapter, norm_from
from qkinspect.loading.adapters.registry import register


def sectioned_qkv(w: Tensor, H: int, G: int, d: int) -> tuple[Tensor, Tensor, Tensor]:
    """Fused nn.Linear weight sectioned [q | k | v] by rows, (H*d + 2*G*d, D) -> W_Q (H, D, d), W_K, W_V (G, D, d)."""
    q, k, v = w.split([H * d, G * d, G * d], dim=0)  # (H*d, D), (G*d, D), (G*d, D)
    return heads_in(q, H, d), heads_in(k, G, d), heads_in(v, G, d)


def sectioned_bias(b: Tensor | None, H: int, G: int, d: int) -> tuple[Tensor | None, ...]:
    """Fused bias (H*d + 2*G*d,) -> b_Q (H, d), b_K (G, d), b_V (G, d)."""
    if b is None:
        return None, None, None
    q, k, v = b.split([H * d, G * d, G * d])
    return bias_heads(q, H, d), bias_heads(k, G, d), bias_heads(v, G, d)


@register
class PhiAdapter(SplitProjectionAdapter):
    """Phi: partial rotary, LayerNorm input, dense output; q/k LayerNorm gains (and biases, in `extra`) when
    `qk_layernorm` is set.

    Example:
        >>> with open_model("path/to/phi-2") as m:  # doctest: +SKIP
        ...     m.info.blocks[0].rotary_dims  # 32 of d_head 80
    """

    model_types = ("phi",)
    proj = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "dense"}
    norm_kind = "layernorm"
    qk_norm_kind = "layernorm"

    @property
    def qk_norm_paths(self) -> tuple[str, str] | None:  # type: ignore[override]
        return ("q_layernorm", "k_layernorm") if getattr(self.config, "qk_layernorm", False) else None


@register
class Phi3Adapter(SplitProjectionAdapter):
    """Phi-3: fused qkv_proj sectioned [q | k | v]; RMSNorm input; RoPE (partial when the config says so).

    Example:
        >>> with open_model("path/to/phi-3-mini") as m:  # doctest: +SKIP
        ...     next(m.layers()).W_K.shape  # (n_kv_heads, d_model, d_head)
    """

    model_types = ("phi3",)
    required_roles = ("qkv", "o")

    def names(self, layer: int) -> dict[str, str]:
        p = f"layers.{layer}.self_attn"
        return {"qkv": f"{p}.qkv_proj.weight", "o": f"{p}.o_proj.weight", "bqkv": f"{p}.qkv_proj.bias",
                "bo": f"{p}.o_proj.bias", "norm_w": f"layers.{layer}.input_layernorm.weight"}

    def expected_shapes(self, block: str, layer: int) -> dict[str, tuple[int, ...]]:
        s, n = self._spec, self.names(layer)
        H, G, d, D = s.n_heads, s.n_kv_heads, s.d_head, s.d_model
        rows = (H + 2 * G) * d
        shapes = {"qkv": (rows, D), "o": (D, H * d), "bqkv": (rows,), "bo": (D,), "norm_w": (D,)}
        return {n[r]: shape for r, shape in shapes.items()}

    def _build(self, layer: int, t: Mapping[str, Tensor]) -> AttentionLayer:
        s = self._spec
        H, G, d = s.n_heads, s.n_kv_heads, s.d_head
        W_Q, W_K, W_V = sectioned_qkv(t["qkv"], H, G, d)
        b_Q, b_K, b_V = sectioned_bias(t.get("bqkv"), H, G, d)
        norm = norm_from(t, "rmsnorm")
        return self._layer(layer, W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=heads_out(t["o"], H, d), b_Q=b_Q, b_K=b_K,
                           b_V=b_V, b_O=t.get("bo"), norm_q=norm, norm_kv=norm)
