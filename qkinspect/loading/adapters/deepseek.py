"""DeepSeek-V2 / V3 Multi-head Latent Attention (MLA), composed into full per-head W_Q, W_K, W_V.

Layout (``model.`` prefix found by the tensor source; r_q = q_lora_rank, r = kv_lora_rank, dn = qk_nope_head_dim,
dr = qk_rope_head_dim, dv = v_head_dim, d = dn + dr)::

    layers.{i}.input_layernorm.weight                 (D,)          RMSNorm feeding attention
    layers.{i}.self_attn.q_a_proj.weight              (r_q, D)      with q_lora_rank (V2, V3)
    layers.{i}.self_attn.q_a_layernorm.weight         (r_q,)        RMSNorm on the query latent
    layers.{i}.self_attn.q_b_proj.weight              (H*d, r_q)    per head [q_nope (dn) | q_pe (dr)]
    layers.{i}.self_attn.q_proj.weight                (H*d, D)      without q_lora_rank (V2-Lite)
    layers.{i}.self_attn.kv_a_proj_with_mqa.weight    (r + dr, D)   [c_kv (r) | k_pe (dr)]
    layers.{i}.self_attn.kv_a_layernorm.weight        (r,)          RMSNorm on c_kv only
    layers.{i}.self_attn.kv_b_proj.weight             (H*(dn+dv), r) per head [k_nope (dn) | v (dv)]
    layers.{i}.self_attn.o_proj.weight                (D, H*dv)

Head h scores ``scale * s_q(x_i) [s_kv(x_j) x_i A_nope^h x_jᵀ + a² x_i A_pe^h R(j-i) x_jᵀ]`` where s_q = 1/rms(query
latent), s_kv = 1/rms(c_kv) are per-token scalars and a is the RoPE attention factor (YaRN; 1 otherwise). The
canonical head is the full concatenated d = dn + dr: the norms' gains are folded into the products,

    W_Q^h = W_qa diag(γ_q) W_qb^h                       (D, d)   (or W_q^h)
    W_K^h = [W_kva_c diag(γ_kv) W_kvb_k^h | W_kva_pe]   (D, d)   rope columns shared by every head
    W_V^h = W_kva_c diag(γ_kv) W_kvb_v^h                (D, dv)

with the RoPE columns of W_Q and W_K multiplied by a. The scalars s_q, s_kv are not part of W: the form is the one at
unit latent RMS (s_q is a per-token temperature common to a query's whole head; s_kv multiplies only the content
part of a key). n_kv_heads = n_heads: each head's content key differs through W_kvb; only the rotary part is shared.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from qkinspect.errors import UnsupportedModelError
from qkinspect.layer import AttentionLayer, BlockSpec
from qkinspect.loading.adapters._decoder import DecoderAdapter, norm_from
from qkinspect.loading.adapters.base import heads_in, heads_out
from qkinspect.loading.adapters.registry import register
from qkinspect.loading.source import storage_dtype

if TYPE_CHECKING:
    import torch
    from torch import Tensor

_FP8 = ("float8_e4m3fn", "float8_e5m2")  # storage dtypes, by name: torch is imported only to read weights


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """DeepSeek's YaRN magnitude correction (yarn_get_mscale in its modeling code)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def softmax_scale(rope: Mapping[str, Any], d_head: int) -> float:
    """d**-0.5, times mscale(factor, mscale_all_dim)² for a scaled RoPE that sets mscale_all_dim
    (yarn_apply_mscale in transformers' DeepSeek code)."""
    scale = d_head**-0.5
    if rope.get("rope_type", "default") != "default" and rope.get("mscale_all_dim"):
        m = yarn_mscale(rope["factor"], rope["mscale_all_dim"])
        scale = scale * m * m
    return scale


def rope_attention_factor(config: Any) -> float:
    """The factor transformers multiplies cos and sin by, so that the rotary part of q and of k each carry it: YaRN's
    `attention_factor`, else mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are set, else
    mscale(factor) (transformers' _compute_yarn_parameters); 1 for the RoPE types without one."""
    rope = config.rope_parameters
    kind = rope.get("rope_type", "default")
    if kind in ("default", "linear", "dynamic", "llama3"):
        return 1.0
    if kind != "yarn":
        raise UnsupportedModelError(f"MLA with rope_type {kind!r} is not supported (default and yarn are)")
    if rope.get("attention_factor") is not None:
        return float(rope["attention_factor"])
    factor = rope.get("factor") or config.max_position_embeddings / rope["original_max_position_embeddings"]
    mscale, mscale_all = rope.get("mscale"), rope.get("mscale_all_dim")
    if mscale and mscale_all:
        return float(yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all))
    return float(yarn_mscale(factor))


def _work_dtype(t: Tensor) -> torch.dtype:
    """Products are formed in float32 (float64 when stored so): bf16 products would round the composed weights."""
    import torch

    return torch.float64 if t.dtype == torch.float64 else torch.float32


class MLAAdapter(DecoderAdapter):
    """Shared by DeepSeek-V2 and V3; they differ only in the rotary layout (`rotary_style`)."""

    layer_path = "layers.{i}"
    norm_path = "input_layernorm"
    required_roles = ("kv_a", "kv_norm", "kv_b", "o")

    # -- shapes and spec ---------------------------------------------------------------------------------

    def dims(self) -> tuple[int, int, int, int, int | None]:
        """(dn, dr, dv, kv_lora_rank, q_lora_rank or None)."""
        c = self.config
        return c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank, c.q_lora_rank

    def block_spec(self) -> BlockSpec:
        c = self.config
        dn, dr, dv, _, _ = self.dims()
        H, d = c.num_attention_heads, dn + dr
        return BlockSpec(name="decoder", n_layers=c.num_hidden_layers, n_heads=H, n_kv_heads=H, d_model=c.hidden_size,
                         d_head=d, d_head_v=dv, positional="rope", rotary_dims=dr,
                         scale=softmax_scale(c.rope_parameters, d))

    def rotary_style(self) -> str:
        raise NotImplementedError

    def layer_extra(self, layer: int) -> dict[str, Any]:
        dn, dr, _, r, rq = self.dims()
        mla = {"kv_lora_rank": r, "q_lora_rank": rq, "qk_nope_head_dim": dn, "qk_rope_head_dim": dr,
               "rotary_position": "last", "key_scalar": "content part only", "query_scalar": "whole head",
               "rope_attention_factor": rope_attention_factor(self.config)}
        return {"rotary_style": self.rotary_style(), "mla": mla}

    def names(self, layer: int) -> dict[str, str]:
        p = f"{self.layer_path.format(i=layer)}.self_attn"
        mods = {"kv_a": "kv_a_proj_with_mqa", "kv_norm": "kv_a_layernorm", "kv_b": "kv_b_proj", "o": "o_proj"}
        if self.dims()[4] is None:
            mods["q"] = "q_proj"
        else:
            mods.update(q_a="q_a_proj", q_norm="q_a_layernorm", q_b="q_b_proj")
        n = {role: f"{p}.{m}.weight" for role, m in mods.items()}
        n.update(bq_a=f"{p}.q_a_proj.bias", bkv_a=f"{p}.kv_a_proj_with_mqa.bias", bo=f"{p}.o_proj.bias")
        scaled = ("q", "q_a", "q_b", "kv_a", "kv_b", "o")  # FP8 checkpoints' block scales: refused in `_build`
        n.update({f"scale_{r}": f"{p}.{mods[r]}.weight_scale_inv" for r in scaled if r in mods})
        return {**n, **self.norm_names(layer)}

    def tensor_names(self, block: str, layer: int) -> list[str]:
        n = self.names(layer)
        q_roles = ("q",) if "q" in n else ("q_a", "q_norm", "q_b")
        return [n[r] for r in (*q_roles, *self.required_roles)]

    def optional_names(self, block: str, layer: int) -> list[str]:
        required = set(self.tensor_names(block, layer))
        return [v for v in self.names(layer).values() if v not in required]

    def expected_shapes(self, block: str, layer: int) -> dict[str, tuple[int, ...]]:
        s, n = self._spec, self.names(layer)
        dn, dr, dv, r, rq = self.dims()
        H, D, d = s.n_heads, s.d_model, s.d_head
        shapes = {"q": (H * d, D), "q_a": (rq, D), "q_norm": (rq,), "q_b": (H * d, rq), "bq_a": (rq,),
                  "kv_a": (r + dr, D), "bkv_a": (r + dr,), "kv_norm": (r,), "kv_b": (H * (dn + dv), r),
                  "o": (D, H * dv), "bo": (D,), "norm_w": (D,)}
        return {n[role]: shape for role, shape in shapes.items() if role in n}

    # -- composition -------------------------------------------------------------------------------------

    def _build(self, layer: int, t: Mapping[str, Tensor]) -> AttentionLayer:
        refuse_quantized(t)
        s = self._spec
        H, dv = s.n_heads, s.v_head
        a = self.layer_extra(layer)["mla"]["rope_attention_factor"]
        W_Q, b_Q = self.query(t, a)
        W_K, b_K, W_V, b_V = self.key_value(t, a)
        norm = norm_from(t, "rmsnorm")
        return self._layer(layer, W_Q=W_Q, W_K=W_K, W_V=W_V, b_Q=b_Q, b_K=b_K, b_V=b_V,
                           W_O=heads_out(t["o"], H, dv),  # (D, H*dv) -> (H, dv, D)
                           b_O=t.get("bo"), norm_q=norm, norm_kv=norm)

    def query(self, t: Mapping[str, Tensor], a: float) -> tuple[Tensor, Tensor | None]:
        """W_Q (H, D, d) and b_Q (H, d) or None, RoPE columns times a."""
        s = self._spec
        H, d = s.n_heads, s.d_head
        if "q" in t:  # no query latent: q_proj has no bias
            return rope_times(heads_in(t["q"], H, d), a, s.rotary_dims), None  # (H*d, D) -> (H, D, d)
        wt = _work_dtype(t["q_a"])
        A = t["q_a"].to(wt).T * t["q_norm"].to(wt)  # (r_q, D) -> (D, r_q), columns times γ_q
        B = heads_in(t["q_b"].to(wt), H, d)  # (H*d, r_q) -> (H, r_q, d)
        W_Q = rope_times(A @ B, a, s.rotary_dims)  # (D, r_q) @ (H, r_q, d) -> (H, D, d)
        b = t.get("bq_a")
        b_Q = None if b is None else rope_times((b.to(wt) * t["q_norm"].to(wt)) @ B, a, s.rotary_dims)  # (H, d)
        return W_Q, b_Q

    def key_value(self, t: Mapping[str, Tensor], a: float) -> tuple[Tensor, Tensor | None, Tensor, Tensor | None]:
        """W_K (H, D, d), b_K, W_V (H, D, dv), b_V: content parts through the latent, the shared RoPE part after."""
        import torch

        s = self._spec
        dn, dr, dv, r, _ = self.dims()
        H, D = s.n_heads, s.d_model
        wt = _work_dtype(t["kv_a"])
        g = t["kv_norm"].to(wt)
        kv_a = t["kv_a"].to(wt)
        A, pe = kv_a[:r].T * g, kv_a[r:].T * a  # (r+dr, D) -> (D, r) times γ_kv, and (D, dr) times a
        kv_b = heads_in(t["kv_b"].to(wt), H, dn + dv)  # (H*(dn+dv), r) -> (H, r, dn+dv)
        B_k, B_v = kv_b[..., :dn], kv_b[..., dn:]  # (H, r, dn), (H, r, dv)
        W_K = torch.cat([A @ B_k, pe.expand(H, D, dr)], dim=-1)  # (H, D, dn) | (H, D, dr) -> (H, D, d)
        W_V = A @ B_v  # (D, r) @ (H, r, dv) -> (H, D, dv)
        b = t.get("bkv_a")
        if b is None:
            return W_K, None, W_V, None
        c = b[:r].to(wt) * g  # (r,)
        b_K = torch.cat([c @ B_k, (b[r:].to(wt) * a).expand(H, dr)], dim=-1)  # (H, dn) | (H, dr) -> (H, d)
        return W_K, b_K, W_V, c @ B_v  # b_V: (r,) @ (H, r, dv) -> (H, dv)


def rope_times(w: Tensor, a: float, dr: int) -> Tensor:
    """w (..., d) with its last dr (rotary) columns multiplied by a; w itself when a == 1."""
    if a == 1.0:
        return w
    import torch

    return torch.cat([w[..., :-dr], w[..., -dr:] * a], dim=-1)


def refuse_quantized(t: Mapping[str, Tensor]) -> None:
    """FP8 checkpoints (DeepSeek-V3 as released) store block scales beside the weights; reading the raw FP8 values
    without them would give wrong matrices."""
    if any(k.startswith("scale_") for k in t) or any(storage_dtype(v) in _FP8 for v in t.values()):
        raise UnsupportedModelError("FP8 block-quantized MLA weights (weight_scale_inv) are not supported; "
                                    "use a bf16/fp16 conversion of the checkpoint")


@register
class DeepseekV2Adapter(MLAAdapter):
    """DeepSeek-V2 (and V2-Lite, without q_lora_rank): RoPE on complex pairs (2i, 2i+1) of the rotary dims.

    Example:
        >>> with open_model("path/to/deepseek-v2-lite") as m:  # doctest: +SKIP
        ...     lay = next(m.layers())
        ...     lay.W_K.shape, lay.extra["mla"]["key_scalar"]  # (n_heads, d_model, nope + rope), "content part only"
    """

    model_types = ("deepseek_v2",)

    def rotary_style(self) -> str:
        return "interleaved"


@register
class DeepseekV3Adapter(MLAAdapter):
    """DeepSeek-V3: rope_interleave (the default) rotates pairs (2i, 2i+1), else rotate-half.

    Example:
        >>> with open_model("path/to/deepseek-v3-bf16") as m:  # doctest: +SKIP
        ...     next(m.layers()).spec.d_head_v  # v_head_dim
    """

    model_types = ("deepseek_v3",)

    def rotary_style(self) -> str:
        return "interleaved" if self.config.rope_interleave else "half"
