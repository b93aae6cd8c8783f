"""SigLIP: CLIP's two towers (text, vision; pre-LN ``layer_norm1``), plus the vision tower's attention-pooling head.

Towers: as CLIP (`clip.ClipTowers`), blocks labelled "text" and "vision"; the text tower is bidirectional (no
causal mask, unlike CLIP's). Pooling head (``vision_use_head``, the default): one nn.MultiheadAttention whose single
query is a learned ``probe`` and whose keys/values are the vision encoder's output after ``post_layernorm``::

    head.probe                       (1, 1, D)   the query input (a parameter: no norm precedes it)
    head.attention.in_proj_weight    (3*D, D)    fused, sectioned [q | k | v] rows, nn.Linear [out, in]
    head.attention.in_proj_bias      (3*D,)
    head.attention.out_proj.weight   (D, D)

It is exposed as its own block, kind "cross" (queries and keys read different streams) labelled "pooling", one
layer, with the vision tower's heads: its W_Q W_Kᵀ is a genuine bilinear form on the residual stream, and leaving
it out would hide the one attention that produces SigLIP's image embedding. `norm_q` is None (the probe is not
normalised), so ``--fold-ln`` refuses this block; select ``--block text,vision`` to fold the towers alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from qkinspect.layer import AttentionLayer, BlockSpec, Norm
from qkinspect.loading.adapters._decoder import check_shapes
from qkinspect.loading.adapters.base import heads_out
from qkinspect.loading.adapters.clip import ClipTowers
from qkinspect.loading.adapters.fused import sectioned, to_heads
from qkinspect.loading.adapters.registry import register

if TYPE_CHECKING:
    from torch import Tensor

POOLING = "pooling"


def pooling_spec(vision: Any) -> BlockSpec:
    """The attention-pooling head's block: one layer, the vision tower's heads and width."""
    D, H = vision.hidden_size, vision.num_attention_heads
    return BlockSpec(name="cross", label=POOLING, n_layers=1, n_heads=H, n_kv_heads=H, d_model=D, d_head=D // H,
                     d_model_kv=D)


class _SiglipTowers(ClipTowers):
    """CLIP's towers, plus the "pooling" block where the checkpoint has a vision tower with its head."""

    def blocks(self) -> list[BlockSpec]:
        vision = self.towers().get("vision")
        head = vision is not None and getattr(vision, "vision_use_head", True)
        return super().blocks() + ([pooling_spec(vision)] if head else [])

    def _head(self) -> str:
        return f"{self.tower_prefix['vision']}head.attention"

    def _pooling_names(self) -> dict[str, str]:
        a, v = self._head(), self.tower_prefix["vision"]
        return {"qkv": f"{a}.in_proj_weight", "o": f"{a}.out_proj.weight", "bqkv": f"{a}.in_proj_bias",
                "bo": f"{a}.out_proj.bias", "norm_w": f"{v}post_layernorm.weight", "norm_b": f"{v}post_layernorm.bias"}

    def tensor_names(self, block: str, layer: int) -> list[str]:
        if block != POOLING:
            return super().tensor_names(block, layer)
        n = self._pooling_names()
        return [n["qkv"], n["o"]]

    def optional_names(self, block: str, layer: int) -> list[str]:
        if block != POOLING:
            return super().optional_names(block, layer)
        n = self._pooling_names()
        return [n[r] for r in ("bqkv", "bo", "norm_w", "norm_b")]

    def output_names(self, block: str, layer: int) -> list[str]:
        if block != POOLING:
            return super().output_names(block, layer)
        n = self._pooling_names()
        return [n["o"], n["bo"]]

    def expected_shapes(self, block: str, layer: int) -> dict[str, tuple[int, ...]]:
        """Required tensors' shapes (checked by the loader); the pooling block's optional ones too (checked here)."""
        if block != POOLING:
            return super().expected_shapes(block, layer)
        D, n = self.spec(POOLING).d_model, self._pooling_names()
        shapes = {"qkv": (3 * D, D), "o": (D, D), "bqkv": (3 * D,), "bo": (D,), "norm_w": (D,), "norm_b": (D,)}
        return {n[r]: s for r, s in shapes.items()}

    def build(self, block: str, layer: int, tensors: Mapping[str, Tensor]) -> AttentionLayer:
        if block != POOLING:
            return super().build(block, layer, tensors)
        check_shapes(tensors, self.expected_shapes(block, layer))
        s, n = self.spec(POOLING), self._pooling_names()
        t = {r: tensors.get(name) for r, name in n.items()}
        H, d = s.n_heads, s.d_head
        W_Q, W_K, W_V = (to_heads(x) for x in sectioned(t["qkv"], H, H, d))  # (3*D, D) -> 3 x (H, D, d)
        b_Q, b_K, b_V = sectioned(t["bqkv"], H, H, d) if t["bqkv"] is not None else (None, None, None)
        norm = None if t["norm_w"] is None else Norm("layernorm", t["norm_w"], t["norm_b"])
        return AttentionLayer(spec=s, layer=layer, W_Q=W_Q, W_K=W_K, W_V=W_V,
                              W_O=heads_out(t["o"], H, d),  # (D, H*d) -> (H, d, D)
                              b_Q=b_Q, b_K=b_K, b_V=b_V, b_O=t["bo"], norm_q=None, norm_kv=norm,
                              extra={"query": "learned probe"})


def _vision_only(config: Any) -> bool:
    """SiglipForImageClassification checkpoints hold the vision tower alone."""
    archs = getattr(config, "architectures", None) or []
    return bool(archs) and all("ImageClassification" in a for a in archs)


@register
class SiglipAdapter(_SiglipTowers):
    """SigLIP (google/siglip-*): blocks "text", "vision" and "pooling".

    Example:
        >>> with open_model("path/to/siglip") as m:  # doctest: +SKIP
        ...     [b.key for b in m.info.blocks]  # ['text', 'vision', 'pooling']
    """

    model_types = ("siglip",)
    tower_prefix = {"text": "text_model.", "vision": "vision_model."}

    def towers(self) -> dict[str, Any]:
        vision = {"vision": self.config.vision_config}
        return vision if _vision_only(self.config) else {"text": self.config.text_config, **vision}


@register
class SiglipTextAdapter(_SiglipTowers):
    model_types = ("siglip_text_model",)

    def towers(self) -> dict[str, Any]:
        return {"text": self.config}


@register
class SiglipVisionAdapter(_SiglipTowers):
    """The vision tower alone: blocks "vision" and (with ``vision_use_head``) "pooling"."""

    model_types = ("siglip_vision_model",)

    def towers(self) -> dict[str, Any]:
        return {"vision": self.config}
