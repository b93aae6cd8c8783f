"""Canonical records that loading produces and metrics consume (ARCHITECTURE.md §2).

Row-vector convention throughout: ``q = x @ W_Q[h] + b_Q[h]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from torch import Tensor


Block = Literal["encoder", "decoder", "cross"]
Positional = Literal["absolute", "rope", "alibi", "relative", "none"]


@dataclass(frozen=True)
class Norm:
    """The normalisation that feeds a projection's input: ``x = gain * normalise(y) + bias``."""

    kind: Literal["layernorm", "rmsnorm"]
    weight: Tensor  # (d_model,)
    bias: Tensor | None = None  # (d_model,) LayerNorm only
    # Gemma-style RMSNorm multiplies by (1 + weight); adapters set this so folding is exact.
    add_unit_offset: bool = False

    @property
    def gain(self) -> Tensor:
        return self.weight + 1 if self.add_unit_offset else self.weight


@dataclass(frozen=True)
class BlockSpec:
    """Shape and flags of one attention block (all its layers share them)."""

    name: Block
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int  # width of the query-side input
    d_head: int
    positional: Positional = "absolute"
    rotary_dims: int | None = None  # RoPE only: how many of d_head are rotated
    qk_norm: bool = False  # per-head RMS/LayerNorm on q and k (Qwen3, OLMo2, Gemma3)
    shared_qk: bool = False  # one matrix for queries and keys (Reformer LSH attention)
    shared_layers: bool = False  # one set of weights for every layer (ALBERT)
    d_model_kv: int | None = None  # width of the key/value input when it differs (cross-attention)
    d_head_v: int | None = None  # value head width when it differs from d_head
    scale: float | None = None  # multiplier on q·k; None means 1/sqrt(d_head)
    attention_kind: str = "full"  # e.g. "lsh", "local", "sliding" (informational)
    # Tells apart blocks of the same kind (CLIP's "text" and "vision" towers, both "encoder"); see `key`.
    label: str | None = None

    @property
    def key(self) -> str:
        """How loaders and records name this block: its label when it has one, else its kind."""
        return self.label or self.name

    @property
    def kv_width(self) -> int:
        return self.d_model_kv or self.d_model

    @property
    def v_head(self) -> int:
        return self.d_head_v or self.d_head

    @property
    def score_scale(self) -> float:
        return self.scale if self.scale is not None else self.d_head**-0.5

    @property
    def group_size(self) -> int:
        """Query heads per key/value head: query head h reads KV head h // group_size."""
        return self.n_heads // self.n_kv_heads

    def flags(self) -> list[str]:
        out = []
        if self.n_kv_heads != self.n_heads:
            out.append("mqa" if self.n_kv_heads == 1 else "gqa")
        if self.qk_norm:
            out.append("qk_norm")
        if self.shared_qk:
            out.append("shared_qk")
        if self.shared_layers:
            out.append("shared_layers")
        if self.attention_kind != "full":
            out.append(self.attention_kind)
        return out


@dataclass(frozen=True)
class AttentionLayer:
    """One layer's attention weights in the canonical layout, float tensors on CPU as stored (any dtype).

    Shapes (H = n_heads, G = n_kv_heads, D = d_model, Dk = key/value input width, d = d_head, dv = value width):
        W_Q (H, D, d)   W_K (G, Dk, d)   W_V (G, Dk, dv)   W_O (H, dv, D) or None
        b_Q (H, d)      b_K (G, d)       b_V (G, dv)       b_O (D,)
    """

    spec: BlockSpec
    layer: int
    W_Q: Tensor
    W_K: Tensor
    W_V: Tensor
    W_O: Tensor | None = None
    b_Q: Tensor | None = None
    b_K: Tensor | None = None
    b_V: Tensor | None = None
    b_O: Tensor | None = None
    q_norm: Tensor | None = None  # per-head q-norm gain, (d,) or (H, d)
    k_norm: Tensor | None = None  # per-head k-norm gain, (d,) or (G, d)
    norm_q: Norm | None = None  # the norm feeding the query input (for --fold-ln)
    norm_kv: Norm | None = None  # the norm feeding the key/value input; same object as norm_q for self-attention
    source_layer: int | None = None  # ALBERT: the layer whose weights these are
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        s = self.spec
        H, G, d, dv = s.n_heads, s.n_kv_heads, s.d_head, s.v_head
        D, Dk = s.d_model, s.kv_width
        expect = {
            "W_Q": (H, D, d),
            "W_K": (G, Dk, d),
            "W_V": (G, Dk, dv),
            "W_O": (H, dv, D),
            "b_Q": (H, d),
            "b_K": (G, d),
            "b_V": (G, dv),
            "b_O": (D,),
        }
        for name, shape in expect.items():
            t = getattr(self, name)
            if t is not None and tuple(t.shape) != shape:
                raise ValueError(
                    f"{s.name} layer {self.layer}: {name} has shape {tuple(t.shape)}, expected {shape}"
                )
        if H % G:
            raise ValueError(f"n_heads={H} is not a multiple of n_kv_heads={G}")

    @property
    def block(self) -> str:
        """The block's key: its kind (encoder/decoder/cross), or its label where a model has two of a kind."""
        return self.spec.key

    def kv_index(self) -> Tensor:
        """For each query head h, its key/value head h // (H // G) (never h % G: ARCHITECTURE.md §2)."""
        import torch

        return torch.arange(self.spec.n_heads) // self.spec.group_size

    def nbytes(self) -> int:
        ts = (self.W_Q, self.W_K, self.W_V, self.W_O, self.b_Q, self.b_K, self.b_V, self.b_O)
        return sum(t.numel() * t.element_size() for t in ts if t is not None)


@dataclass(frozen=True)
class ModelInfo:
    """Who the model is and what shape it has; recorded with every result."""

    name: str  # the spec as the user gave it (or "demo: all-MiniLM-L6-v2")
    source: str  # the resolved file or folder
    model_type: str
    format: Literal["safetensors", "bin", "gguf", "memory"]
    blocks: tuple[BlockSpec, ...]
    revision: str | None = None
    dtype: str | None = None  # storage dtype of the attention weights
    attention_bytes: int | None = None  # bytes of q/k/v/o weights as stored
    architecture: str | None = None  # e.g. "BertModel"
    quantization: str | None = None  # a quantized checkpoint's scheme, dequantized on read: "fp8 (128x128 blocks)"

    def block(self, name: str) -> BlockSpec:
        for b in self.blocks:
            if b.key == name:
                return b
        raise KeyError(name)


SHAPE_FIELDS = ("n_layers", "n_heads", "n_kv_heads", "d_model", "d_head")


def shape_differences(a: ModelInfo, b: ModelInfo) -> list[str]:
    """What keeps two models' attention blocks from lining up head for head (empty when they do), e.g.
    ["encoder n_heads 12 vs 8"]; a different set of blocks is one difference."""
    sa = {x.key: x for x in a.blocks}
    sb = {x.key: x for x in b.blocks}
    if list(sa) != list(sb):
        return [f"blocks {', '.join(sa)} vs {', '.join(sb)}"]
    return [f"{k} {f} {getattr(sa[k], f)} vs {getattr(sb[k], f)}"
            for k in sa for f in SHAPE_FIELDS if getattr(sa[k], f) != getattr(sb[k], f)]
