"""Shared machinery of the decoder-only adapters: config readers, the `DecoderAdapter` base (one "decoder"
block; every tensor present is shape-checked against the config, optional ones too), and the Llama-style
`SplitProjectionAdapter` that most families specialise by renaming paths. No @register here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from qkinspect.errors import CheckpointError
from qkinspect.layer import AttentionLayer, BlockSpec, Norm
from qkinspect.loading.adapters.base import Adapter, bias_heads, heads_in, heads_out

if TYPE_CHECKING:
    from torch import Tensor

# -- config readers ------------------------------------------------------------------------------------


def n_heads_of(c: Any) -> int:
    return c.num_attention_heads


def n_kv_heads_of(c: Any) -> int:
    """Key/value heads; configs without the field are plain multi-head attention."""
    return getattr(c, "num_key_value_heads", None) or n_heads_of(c)


def head_dim_of(c: Any) -> int:
    """`head_dim` when the config sets it (Gemma, Qwen3: need not be hidden_size / heads)."""
    return getattr(c, "head_dim", None) or c.hidden_size // n_heads_of(c)


def rotary_fraction(c: Any) -> float:
    """Fraction of each head rotated by RoPE (`partial_rotary_factor`, in `rope_parameters` since transformers 5)."""
    rp = getattr(c, "rope_parameters", None) or {}
    if "partial_rotary_factor" in rp:
        return float(rp["partial_rotary_factor"])
    nested = {v.get("partial_rotary_factor", 1.0) for v in rp.values() if isinstance(v, dict)}
    if len(nested) == 1:  # per-layer-type parameters (Gemma3) that agree
        return float(nested.pop())
    return float(getattr(c, "partial_rotary_factor", None) or 1.0)


def rope_spec(c: Any, d_head: int) -> dict[str, Any]:
    """BlockSpec fields for a rotary model."""
    return {"positional": "rope", "rotary_dims": int(d_head * rotary_fraction(c))}


# -- shared adapter machinery ---------------------------------------------------------------------------


class DecoderAdapter(Adapter):
    """One "decoder" block. Subclasses give `block_spec`, `names` (role -> tensor name), `expected_shapes`
    and `_build`; this class checks the shapes of every tensor present (optional ones too) before building."""

    block = "decoder"

    def block_spec(self) -> BlockSpec:
        c = self.config
        d = head_dim_of(c)
        return BlockSpec(name="decoder", n_layers=c.num_hidden_layers, n_heads=n_heads_of(c),
                         n_kv_heads=self.n_kv_heads(), d_model=c.hidden_size, d_head=d, **self.spec_fields(d))

    def n_kv_heads(self) -> int:
        return n_kv_heads_of(self.config)

    def spec_fields(self, d_head: int) -> dict[str, Any]:
        """Positional scheme, scale, qk_norm ... (BlockSpec keyword arguments)."""
        return {}

    @cached_property
    def _spec(self) -> BlockSpec:
        return self.block_spec()

    def blocks(self) -> list[BlockSpec]:
        return [self._spec]

    def layer_spec(self, layer: int) -> BlockSpec:
        """The block's spec refined for one layer: its own `attention_kind` where layers differ ("full",
        "sliding", "local"); families whose scale varies by layer refine that too (GPT-2)."""
        kind = self.layer_kind(layer)
        s = self._spec
        return s if kind is None or kind == s.attention_kind else replace(s, attention_kind=kind)

    def layer_kind(self, layer: int) -> str | None:
        """This layer's attention kind when layers of the block differ; None when they do not."""
        return None

    def layer_extra(self, layer: int) -> dict[str, Any]:
        """Per-layer facts that are not BlockSpec fields (rotary style, sliding window, ...)."""
        return {}

    def names(self, layer: int) -> dict[str, str]:
        """Role ("q", "k", "v", "o", "qkv", "bq", "norm_w", ...) -> tensor name."""
        raise NotImplementedError

    required_roles: tuple[str, ...] = ("q", "k", "v", "o")
    norm_path: str | None = None  # the pre-attention norm inside the layer module
    norm_kind = "rmsnorm"

    def norm_names(self, layer: int) -> dict[str, str]:
        """Roles "norm_w" (and "norm_b" for a LayerNorm) of the pre-attention norm; none without one."""
        if self.norm_path is None:
            return {}
        p = f"{self.layer_path.format(i=layer)}.{self.norm_path}"
        return {"norm_w": f"{p}.weight", **({"norm_b": f"{p}.bias"} if self.norm_kind == "layernorm" else {})}

    def tensor_names(self, block: str, layer: int) -> list[str]:
        n = self.names(layer)
        return [n[r] for r in self.required_roles]

    def optional_names(self, block: str, layer: int) -> list[str]:
        n = self.names(layer)
        return [v for r, v in n.items() if r not in self.required_roles]

    def output_names(self, block: str, layer: int) -> list[str]:
        n = self.names(layer)
        return [n[r] for r in ("o", "bo") if r in n]

    def build(self, block: str, layer: int, tensors: Mapping[str, Tensor]) -> AttentionLayer:
        check_shapes(tensors, self.expected_shapes(block, layer))
        n = self.names(layer)
        by_role = {r: tensors[name] for r, name in n.items() if name in tensors}
        return self._build(layer, by_role)

    def _build(self, layer: int, t: Mapping[str, Tensor]) -> AttentionLayer:
        raise NotImplementedError

    def _layer(self, layer: int, **kw: Any) -> AttentionLayer:
        extra = {**self.layer_extra(layer), **kw.pop("extra", {})}
        return AttentionLayer(spec=self.layer_spec(layer), layer=layer, extra=extra, **kw)


def check_shapes(tensors: Mapping[str, Tensor], expected: Mapping[str, tuple[int, ...]]) -> None:
    """Refuse a tensor whose shape disagrees with the config, naming it (optional tensors included)."""
    for name, want in expected.items():
        t = tensors.get(name)
        if t is not None and tuple(t.shape) != tuple(want):
            raise CheckpointError(f"tensor {name!r} has shape {tuple(t.shape)}, but the config implies {tuple(want)}")


def norm_from(t: Mapping[str, Tensor], kind: str, add_unit_offset: bool = False) -> Norm | None:
    """The pre-attention norm from roles "norm_w" / "norm_b", or None when the checkpoint has none."""
    w = t.get("norm_w")
    if w is None:
        return None
    return Norm(kind, w, t.get("norm_b") if kind == "layernorm" else None, add_unit_offset)  # type: ignore[arg-type]


# -- the Llama layout -----------------------------------------------------------------------------------


class SplitProjectionAdapter(DecoderAdapter):
    """Separate nn.Linear q/k/v/o projections, one per role; subclasses rename the paths."""

    layer_path = "layers.{i}"
    attn_path = "self_attn"
    proj = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj"}
    norm_path: str | None = "input_layernorm"
    norm_kind = "rmsnorm"
    norm_unit_offset = False  # Gemma: RMSNorm multiplies by (1 + weight)
    # q/k norm after the projections (Qwen3, Gemma3, OLMo2): module names inside the attention module, and
    # their scope: "head" normalises each head's d values (gain (d,)), "projection" all H*d at once (OLMo2).
    qk_norm_paths: tuple[str, str] | None = None
    qk_norm_scope = "head"
    qk_norm_kind = "rmsnorm"

    def spec_fields(self, d_head: int) -> dict[str, Any]:
        return {**rope_spec(self.config, d_head), "attention_kind": attention_kind(self.config),
                "qk_norm": self.qk_norm_paths is not None}

    def names(self, layer: int) -> dict[str, str]:
        p = f"{self.layer_path.format(i=layer)}.{self.attn_path}"
        n = {r: f"{p}.{m}.weight" for r, m in self.proj.items()}
        n.update({f"b{r}": f"{p}.{m}.bias" for r, m in self.proj.items()})  # bq, bk, bv, bo
        if self.qk_norm_paths is not None:
            qn, kn = self.qk_norm_paths
            n.update(qn=f"{p}.{qn}.weight", kn=f"{p}.{kn}.weight", qnb=f"{p}.{qn}.bias", knb=f"{p}.{kn}.bias")
        return {**n, **self.norm_names(layer)}

    def expected_shapes(self, block: str, layer: int) -> dict[str, tuple[int, ...]]:
        s, n = self._spec, self.names(layer)
        H, G, d, D = s.n_heads, s.n_kv_heads, s.d_head, s.d_model
        shapes = {"q": (H * d, D), "k": (G * d, D), "v": (G * d, D), "o": (D, H * d),
                  "bq": (H * d,), "bk": (G * d,), "bv": (G * d,), "bo": (D,), "norm_w": (D,), "norm_b": (D,)}
        per_proj = self.qk_norm_scope == "projection"
        shapes.update(qn=(H * d,) if per_proj else (d,), kn=(G * d,) if per_proj else (d,))
        shapes.update(qnb=shapes["qn"], knb=shapes["kn"])
        return {n[r]: shape for r, shape in shapes.items() if r in n}

    def _build(self, layer: int, t: Mapping[str, Tensor]) -> AttentionLayer:
        s = self._spec
        H, G, d = s.n_heads, s.n_kv_heads, s.d_head
        norm = norm_from(t, self.norm_kind, self.norm_unit_offset)
        return self._layer(
            layer,
            W_Q=heads_in(t["q"], H, d),  # (H*d, D) -> (H, D, d)
            W_K=heads_in(t["k"], G, d),  # (G*d, D) -> (G, D, d)
            W_V=heads_in(t["v"], G, d),
            W_O=heads_out(t["o"], H, d),  # (D, H*d) -> (H, d, D)
            b_Q=bias_heads(t.get("bq"), H, d),  # (H*d,) -> (H, d)
            b_K=bias_heads(t.get("bk"), G, d),
            b_V=bias_heads(t.get("bv"), G, d),
            b_O=t.get("bo"),
            norm_q=norm,
            norm_kv=norm,
            **self.qk_norm_fields(t),
        )

    def qk_norm_fields(self, t: Mapping[str, Tensor]) -> dict[str, Any]:
        """q_norm / k_norm gains for families that have them (Qwen3, Gemma3, OLMo2), as multipliers.

        Head scope: gains (d,), shared by the heads. Projection scope (OLMo2): the norm's RMS runs over all H*d
        query values of a token, a positive per-token factor common to every head, so each head still sees
        `x W_Q[h] diag(gain[h])` up to that factor; the (H*d,) gain is reshaped to (H, d), (G*d,) to (G, d).
        """
        if self.qk_norm_paths is None or t.get("qn") is None or t.get("kn") is None:
            return {}
        s = self._spec
        q, k = self.qk_gain(t["qn"]), self.qk_gain(t["kn"])
        if self.qk_norm_scope == "projection":
            q, k = q.reshape(s.n_heads, s.d_head), k.reshape(s.n_kv_heads, s.d_head)  # (H*d,) -> (H, d)
        extra = {"qk_norm_kind": self.qk_norm_kind, "qk_norm_scope": self.qk_norm_scope}
        if t.get("qnb") is not None:  # LayerNorm q/k norms (Phi with qk_layernorm) also have biases
            extra.update(q_norm_bias=t["qnb"], k_norm_bias=t["knb"])
        return {"q_norm": q, "k_norm": k, "extra": extra}

    def qk_gain(self, w: Tensor) -> Tensor:
        """The stored q/k-norm weight as the multiplier it is (Gemma3 overrides: 1 + weight)."""
        return w

    rotary_style = "half"  # rotate_half: dims (i, i + r/2) are rotated together; GPT-J: "interleaved" (2i, 2i+1)

    def layer_extra(self, layer: int) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self._spec.positional == "rope":
            extra["rotary_style"] = self.rotary_style
        if layer_kinds(self.config):
            extra["layer_type"] = self.config.layer_types[layer]  # as the config names it
        if self.layer_spec(layer).attention_kind == "sliding":
            extra["sliding_window"] = self.config.sliding_window
        return extra

    def layer_kind(self, layer: int) -> str | None:
        kinds = layer_kinds(self.config)
        return kinds[layer] if kinds else None


def layer_kinds(c: Any) -> list[str] | None:
    """Per-layer kinds from `config.layer_types` ("sliding_attention" -> "sliding", "full_attention" -> "full")."""
    types = getattr(c, "layer_types", None)
    return [t.removesuffix("_attention") for t in types] if types else None


def attention_kind(c: Any) -> str:
    """The block summary: "full", "sliding" (Mistral: every layer), or the layers' kinds joined ("full+sliding")."""
    kinds = layer_kinds(c)
    if kinds:
        return "+".join(sorted(set(kinds)))
    window = getattr(c, "sliding_window", None)
    return "sliding" if window and getattr(c, "use_sliding_window", True) is not False else "full"


def with_scale(spec: BlockSpec, scale: float | None) -> BlockSpec:
    return spec if scale is None or scale == spec.score_scale else replace(spec, scale=scale)
