"""Shared machinery for families whose attention keeps separate q/k/v/o ``nn.Linear`` layers.

A family adapter says, per (block, layer), where its four projections and the norms feeding them live
(`Projections`); this base class turns that into the loader's name lists, the shapes the config implies,
and the canonical `AttentionLayer`. No @register here: this module defines no adapter of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from qkinspect.layer import AttentionLayer, BlockSpec, Norm
from qkinspect.loading.adapters.base import Adapter, bias_heads, heads_in, heads_out

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class Projections:
    """Module prefixes (state-dict names without ``.weight``/``.bias``) of one layer's attention.

    `q` and `k` may name the same module (Reformer's shared ``query_key``). `norm_q` is the norm whose output
    the queries read; for self-attention the keys and values read the same norm, for cross-attention they
    read `norm_kv` (``cross=True``). None means no norm directly precedes the projection.
    """

    q: str
    k: str
    v: str
    o: str
    norm_q: str | None = None
    norm_kv: str | None = None
    cross: bool = False


class ProjectionAdapter(Adapter):
    """An adapter for separate q/k/v/o linear layers: subclasses define `blocks` and `projections`.

    Example (a third-party family, registered through the ``qkinspect.adapters`` entry point):
        >>> class TinyAdapter(ProjectionAdapter):
        ...     model_types = ("tiny",)
        ...     def blocks(self):
        ...         c = self.config
        ...         return [self_attention_spec("encoder", c.num_hidden_layers, c.num_attention_heads, c.hidden_size)]
        ...     def projections(self, block, layer):
        ...         a = f"layers.{layer}.attn"
        ...         return Projections(f"{a}.q", f"{a}.k", f"{a}.v", f"{a}.o", norm_q=f"layers.{layer}.norm")
    """

    norm_kind: ClassVar[Literal["layernorm", "rmsnorm"]] = "layernorm"

    def projections(self, block: str, layer: int) -> Projections:
        raise NotImplementedError

    def layer_spec(self, block: str, layer: int) -> BlockSpec:
        """The spec one layer's record carries: the block's, refined per layer where layers differ."""
        return self.spec(block)

    def source_layer(self, block: str, layer: int) -> int | None:
        """For weights shared across layers: the first layer that reads the same tensors."""
        return None

    def layer_extra(self, block: str, layer: int) -> dict[str, Any]:
        return {}

    def tensor_names(self, block: str, layer: int) -> list[str]:
        p = self.projections(block, layer)
        return list(dict.fromkeys(f"{m}.weight" for m in (p.q, p.k, p.v, p.o)))

    def output_names(self, block: str, layer: int) -> list[str]:
        p = self.projections(block, layer)
        return [f"{p.o}.weight", f"{p.o}.bias"]

    def _norm_prefixes(self, p: Projections) -> list[str]:
        return [n for n in dict.fromkeys((p.norm_q, p.norm_kv if p.cross else None)) if n is not None]

    def optional_names(self, block: str, layer: int) -> list[str]:
        p = self.projections(block, layer)
        biases = [f"{m}.bias" for m in dict.fromkeys((p.q, p.k, p.v, p.o))]
        norms = [f"{n}.{w}" for n in self._norm_prefixes(p) for w in ("weight", "bias")]
        return biases + norms

    def expected_shapes(self, block: str, layer: int) -> dict[str, tuple[int, ...]]:
        s, p = self.layer_spec(block, layer), self.projections(block, layer)
        H, G, d, dv = s.n_heads, s.n_kv_heads, s.d_head, s.v_head
        shapes = {
            f"{p.q}.weight": (H * d, s.d_model),
            f"{p.k}.weight": (G * d, s.kv_width),
            f"{p.v}.weight": (G * dv, s.kv_width),
            f"{p.o}.weight": (s.d_model, H * dv),
            f"{p.q}.bias": (H * d,),  # optional tensors: checked when present
            f"{p.k}.bias": (G * d,),
            f"{p.v}.bias": (G * dv,),
            f"{p.o}.bias": (s.d_model,),
        }
        for prefix, width in ((p.norm_q, s.d_model), (p.norm_kv if p.cross else None, s.kv_width)):
            if prefix is not None:  # the norm whose output the projection reads: one gain per input channel
                shapes.update({f"{prefix}.weight": (width,), f"{prefix}.bias": (width,)})
        return shapes

    def _make_norm(self, tensors: Mapping[str, Tensor], prefix: str | None) -> Norm | None:
        w = None if prefix is None else tensors.get(f"{prefix}.weight")
        if w is None:
            return None
        bias = tensors.get(f"{prefix}.bias") if self.norm_kind == "layernorm" else None
        return Norm(self.norm_kind, w, bias)

    def build(self, block: str, layer: int, tensors: Mapping[str, Tensor]) -> AttentionLayer:
        s, p = self.layer_spec(block, layer), self.projections(block, layer)
        H, G, d, dv = s.n_heads, s.n_kv_heads, s.d_head, s.v_head
        t = tensors.get
        norm_q = self._make_norm(tensors, p.norm_q)
        return AttentionLayer(
            spec=s,
            layer=layer,
            W_Q=heads_in(t(f"{p.q}.weight"), H, d),  # (H*d, D) -> (H, D, d)
            W_K=heads_in(t(f"{p.k}.weight"), G, d),  # (G*d, Dk) -> (G, Dk, d)
            W_V=heads_in(t(f"{p.v}.weight"), G, dv),  # (G*dv, Dk) -> (G, Dk, dv)
            W_O=heads_out(t(f"{p.o}.weight"), H, dv),  # (D, H*dv) -> (H, dv, D)
            b_Q=bias_heads(t(f"{p.q}.bias"), H, d),  # (H*d,) -> (H, d)
            b_K=bias_heads(t(f"{p.k}.bias"), G, d),
            b_V=bias_heads(t(f"{p.v}.bias"), G, dv),
            b_O=t(f"{p.o}.bias"),
            norm_q=norm_q,
            norm_kv=self._make_norm(tensors, p.norm_kv) if p.cross else norm_q,
            source_layer=self.source_layer(block, layer),
            extra=self.layer_extra(block, layer),
        )


def self_attention_spec(name: str, n_layers: int, n_heads: int, d_model: int, d_head: int | None = None,
                        **flags: Any) -> BlockSpec:
    """A BlockSpec for multi-head self-attention (as many key/value heads as query heads)."""
    return BlockSpec(name=name, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_heads, d_model=d_model,
                     d_head=d_head or d_model // n_heads, **flags)


def encoder_only(config: Any) -> bool:
    """True for a checkpoint of an encoder-decoder family's encoder alone (T5EncoderModel,
    WhisperForAudioClassification): only its encoder's tensors are stored."""
    archs = getattr(config, "architectures", None) or []
    return bool(archs) and all("EncoderModel" in a or "AudioClassification" in a for a in archs)
