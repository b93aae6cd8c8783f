"""MPT: one bias-free fused projection sectioned [q | k | v]; ALiBi; LayerNorm without bias.

    blocks.{i}.norm_1.weight           (D,)     LayerNorm feeding attention (no bias when no_bias=True)
    blocks.{i}.attn.Wqkv.weight        (3*D, D) rows: D query, D key, D value
    blocks.{i}.attn.out_proj.weight    (D, D)

`attn_config.softmax_scale` overrides the score scale; `attn_config.clip_qkv` (a clamp on the projections,
which no linear reading can include) is recorded in `extra["clip_qkv"]`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qkinspect.loading.adapters.fused import Blocks, FusedQKVAdapter, sectioned
from qkinspect.loading.adapters.registry import register

if TYPE_CHECKING:
    from torch import Tensor


@register
class MptAdapter(FusedQKVAdapter):
    """MPT: fused Wqkv sectioned [q | k | v]; ALiBi (or learned positions when alibi is off).

    Example:
        >>> with open_model("path/to/mpt-7b") as m:  # doctest: +SKIP
        ...     next(m.layers()).b_Q  # None: MPT has no biases
    """

    model_types = ("mpt",)
    layer_path = "blocks.{i}"
    attn_path = "attn"
    qkv_name = "Wqkv"
    out_name = "out_proj"
    norm_path = "norm_1"

    def _attn_config(self, key: str, default: Any = None) -> Any:
        ac = self.config.attn_config  # an MptAttentionConfig, or a plain dict in older configs
        return ac.get(key, default) if isinstance(ac, dict) else getattr(ac, key, default)

    def spec_fields(self, d_head: int) -> dict[str, Any]:
        scale = self._attn_config("softmax_scale")
        return {"positional": "alibi" if self._attn_config("alibi", True) else "absolute",
                "scale": None if scale is None else float(scale)}

    def layer_extra(self, layer: int) -> dict[str, Any]:
        clip = self._attn_config("clip_qkv")
        return {} if clip is None else {"clip_qkv": float(clip)}

    def layout(self, w: Tensor) -> Blocks:
        s = self._spec
        return sectioned(w, s.n_heads, s.n_kv_heads, s.d_head)  # (3*H*d, ...) -> q, k, v (H, d, ...)
