"""How each llama.cpp architecture lays out the attention of a Hugging Face model, written once per architecture.

llama.cpp's converter (``convert_hf_to_gguf.py``) renames every tensor to ``blk.N.<role>`` and, for some
architectures, changes its values; a `Layout` records what it did, so that `qkinspect.loading.gguf` can give the
adapters the Hugging Face tensors back:

- ``permuted_qk``: the rows of Q and K are permuted (``LlamaModel.permute``) because llama.cpp's "normal" rotary
  kernel pairs adjacent dimensions where Hugging Face's pairs the two halves (llama, granite). NeoX-type
  architectures (qwen2, gemma, phi3, ...) and those whose Hugging Face model already pairs adjacent dimensions
  (command-r) are written as they are.
- ``norm_plus_one``: every ``*norm.weight`` was written as ``gamma + 1`` (Gemma's RMSNorm multiplies by ``1 + gamma``;
  llama.cpp's by the stored value).
- ``qkv``: how the fused ``attn_qkv`` relates to the Hugging Face tensor: ``"same"`` (phi3), ``"transposed"``
  (GPT-2's Conv1D, also its ``attn_output``), ``"grouped"`` (BLOOM, Falcon: the converter turned the per-head or
  per-KV-group interleaving into sections ``[q | k | v]``).
- ``mla``: DeepSeek's Multi-head Latent Attention (``deepseek2``). Files written since llama.cpp's MLA change split
  ``kv_b_proj`` (rows per head ``[k_nope (dn) | v (dv)]``) into ``attn_k_b`` (per head ``k_nope`` transposed: GGUF
  ``[dn, r, H]``) and ``attn_v_b`` (GGUF ``[r, dv, H]``); older files keep it whole as ``attn_kv_b``. Either way the
  source gives the adapter ``kv_b_proj`` back; the rotary dims are not permuted (llama.cpp's "normal" RoPE pairs
  adjacent dims, as DeepSeek's own checkpoints do).

The config of each architecture is a config.json-style dict built from the GGUF metadata (`Meta`), read by the
same light config reader as a folder's config.json, so opening a GGUF file needs no transformers import.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from qkinspect.errors import UnsupportedModelError

LLAMA_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "attn_norm": "input_layernorm",
               "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
PHI3_NAMES = {"attn_qkv": "self_attn.qkv_proj", "attn_output": "self_attn.o_proj", "attn_norm": "input_layernorm"}
GPT2_NAMES = {"attn_qkv": "attn.c_attn", "attn_output": "attn.c_proj", "attn_norm": "ln_1"}
DEEPSEEK2_NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_q_a": "self_attn.q_a_proj",
                   "attn_q_a_norm": "self_attn.q_a_layernorm", "attn_q_b": "self_attn.q_b_proj",
                   "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa", "attn_kv_a_norm": "self_attn.kv_a_layernorm",
                   "attn_kv_b": "self_attn.kv_b_proj", "attn_output": "self_attn.o_proj"}
BLOOM_NAMES = {"attn_qkv": "self_attention.query_key_value", "attn_output": "self_attention.dense",
               "attn_norm": "input_layernorm"}


class Meta:
    """GGUF metadata of one architecture: ``meta("block_count")`` reads ``{arch}.block_count``.

    `read(key, default, per_layer)` is given by the caller: it raises on a missing required key (default ``...``)
    and, unless `per_layer`, makes a per-layer list into its one value (refusing one that varies); `has_tensor` says
    whether the file has a tensor whose name ends with a suffix; `n_vocab` is the vocabulary's length.
    """

    def __init__(self, arch: str, read: Callable[[str, Any, bool], Any], has_tensor: Callable[[str], bool],
                 n_vocab: int | None):
        self.arch, self._read, self.has_tensor, self.n_vocab = arch, read, has_tensor, n_vocab

    def __call__(self, key: str, default: Any = ..., per_layer: bool = False) -> Any:
        return self._read(f"{self.arch}.{key}", default, per_layer)


def sizes(m: Meta) -> dict[str, Any]:
    """The sizes every architecture has, under the Llama-style config names."""
    D, H = int(m("embedding_length")), int(m("attention.head_count"))
    G = int(m("attention.head_count_kv", H))
    d = int(m("attention.key_length", D // H if H else 0))
    return {"hidden_size": D, "num_attention_heads": H, "num_key_value_heads": G, "head_dim": d,
            "num_hidden_layers": int(m("block_count")), "intermediate_size": int(m("feed_forward_length", 4 * D)),
            "max_position_embeddings": int(m("context_length", 2048)),
            "vocab_size": int(m("vocab_size", m.n_vocab or 32000))}


def rotary(m: Meta, c: dict[str, Any]) -> dict[str, Any]:
    """rope_theta, and partial_rotary_factor where the rotary width is below the head width."""
    out: dict[str, Any] = {"rope_theta": float(m("rope.freq_base", 10000.0))}
    dims = int(m("rope.dimension_count", c["head_dim"]))
    if dims != c["head_dim"]:
        out["partial_rotary_factor"] = dims / c["head_dim"]
    return out


def llama_like(m: Meta) -> dict[str, Any]:
    c = sizes(m)
    return {**c, **rotary(m, c), "rms_norm_eps": float(m("attention.layer_norm_rms_epsilon", 1e-6))}


def with_bias(m: Meta) -> dict[str, Any]:
    return {**llama_like(m), "attention_bias": m.has_tensor("attn_q.bias")}


def granite(m: Meta) -> dict[str, Any]:
    return {**with_bias(m), "attention_multiplier": float(m("attention.scale", 1.0))}


def layer_norm(m: Meta, key: str = "layer_norm_eps") -> dict[str, Any]:
    c = sizes(m)
    return {**c, **rotary(m, c), key: float(m("attention.layer_norm_epsilon", 1e-5))}


def stablelm(m: Meta) -> dict[str, Any]:
    return {**layer_norm(m), "use_qkv_bias": m.has_tensor("attn_q.bias")}


def starcoder2(m: Meta) -> dict[str, Any]:
    return {**layer_norm(m, "norm_epsilon"), "use_bias": m.has_tensor("attn_q.bias"),
            "sliding_window": _opt_int(m("attention.sliding_window", None))}


def cohere(m: Meta) -> dict[str, Any]:
    return {**layer_norm(m), "use_qk_norm": m.has_tensor("attn_q_norm.weight"),
            "logit_scale": float(m("logit_scale", 0.0625))}


def gemma_scalar(m: Meta, c: dict[str, Any]) -> int:
    """query_pre_attn_scalar, which GGUF does not store: llama.cpp scales by 1/sqrt(d_model / n_heads) for the
    27B models (46 and 62 layers) and by 1/sqrt(head_dim) otherwise, as their configs say (144 and 168 vs 256)."""
    if c["num_hidden_layers"] in (46, 62):
        return c["hidden_size"] // c["num_attention_heads"]
    return c["head_dim"]


def gemma2(m: Meta) -> dict[str, Any]:
    c = llama_like(m)
    return {**c, "query_pre_attn_scalar": gemma_scalar(m, c),
            "attn_logit_softcapping": _opt_float(m("attn_logit_softcapping", None)),
            "final_logit_softcapping": _opt_float(m("final_logit_softcapping", None)),
            "sliding_window": _opt_int(m("attention.sliding_window", 4096))}


def gemma3(m: Meta) -> dict[str, Any]:
    c = llama_like(m)
    theta = c.pop("rope_theta")
    c.pop("partial_rotary_factor", None)
    full: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    if m("rope.scaling.type", None) == "linear":
        full = {"rope_type": "linear", "rope_theta": theta, "factor": float(m("rope.scaling.factor"))}
    kinds = gemma3_layer_types(m("attention.sliding_window_pattern", 6, per_layer=True), c["num_hidden_layers"])
    return {**c, "query_pre_attn_scalar": gemma_scalar(m, c), "layer_types": kinds,
            "sliding_window": _opt_int(m("attention.sliding_window", 4096)),
            "rope_parameters": {"full_attention": full,
                                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}


def gemma3_layer_types(pattern: Any, n_layers: int) -> list[str]:
    """Gemma 3's layer types from ``attention.sliding_window_pattern``: one flag per layer (True: sliding), or a
    period n (every n-th layer global; llama.cpp's default for gemma3 is 6: five local layers, then one global)."""
    if isinstance(pattern, list):
        if len(pattern) != n_layers:
            raise ValueError(f"sliding_window_pattern has {len(pattern)} entries for {n_layers} layers")
        return ["sliding_attention" if p else "full_attention" for p in pattern]
    return ["full_attention" if (i + 1) % int(pattern) == 0 else "sliding_attention" for i in range(n_layers)]


def gpt2(m: Meta) -> dict[str, Any]:
    c = sizes(m)
    return {"n_embd": c["hidden_size"], "n_head": c["num_attention_heads"], "n_layer": c["num_hidden_layers"],
            "n_positions": c["max_position_embeddings"], "n_inner": c["intermediate_size"],
            "vocab_size": c["vocab_size"], "layer_norm_epsilon": float(m("attention.layer_norm_epsilon", 1e-5))}


def bloom(m: Meta) -> dict[str, Any]:
    c = sizes(m)
    return {"hidden_size": c["hidden_size"], "n_head": c["num_attention_heads"], "n_layer": c["num_hidden_layers"],
            "vocab_size": c["vocab_size"], "layer_norm_epsilon": float(m("attention.layer_norm_epsilon", 1e-5))}


def falcon(m: Meta) -> dict[str, Any]:
    """Falcon's fused layout follows its KV heads: 1 (7B, multi_query), all (per-head), or groups (40B/180B)."""
    c = sizes(m)
    H, G = c["num_attention_heads"], c["num_key_value_heads"]
    return {"hidden_size": c["hidden_size"], "num_attention_heads": H, "num_hidden_layers": c["num_hidden_layers"],
            "num_kv_heads": G, "multi_query": G == 1, "new_decoder_architecture": G not in (1, H),
            "parallel_attn": True, "alibi": False, "bias": m.has_tensor("attn_qkv.bias"),
            "vocab_size": c["vocab_size"], "max_position_embeddings": c["max_position_embeddings"],
            "layer_norm_epsilon": float(m("attention.layer_norm_epsilon", 1e-5)),
            "rope_theta": float(m("rope.freq_base", 10000.0))}


def deepseek2(m: Meta) -> dict[str, Any]:
    """DeepSeek-V2/V3 (and R1, Kimi-K2 ...) as llama.cpp stores them. Head widths: ``attention.key_length_mla`` /
    ``value_length_mla`` where present (files since the MLA change, whose ``key_length`` / ``value_length`` are the
    latent cache's ``kv_lora_rank + rope`` / ``kv_lora_rank`` and ``head_count_kv`` is 1), else ``key_length`` /
    ``value_length`` (older files). The query has a latent (``attn_q_a``, ``q_lora_rank``) or not (``attn_q``,
    V2-Lite): the tensors decide, as in llama.cpp's graph."""
    c = sizes(m)
    dr = int(m("rope.dimension_count"))
    even = c["hidden_size"] // c["num_attention_heads"]  # llama.cpp's default head width
    d = int(m("attention.key_length_mla", None) or c["head_dim"])  # head_dim: key_length, else `even`
    dv = int(m("attention.value_length_mla", None) or m("attention.value_length", even))
    if d <= dr:
        raise ValueError(f"key width {d} leaves no content dims beside {dr} rotary dims")
    plain, latent = m.has_tensor(".attn_q.weight"), m.has_tensor(".attn_q_a.weight")
    if plain and latent:
        raise UnsupportedModelError("the file has both attn_q and attn_q_a: which query is meant is ambiguous")
    if not (plain or latent):
        raise ValueError("the file has neither attn_q nor attn_q_a")
    if m.has_tensor(".attn_kv_b.weight") and m.has_tensor(".attn_k_b.weight"):
        raise UnsupportedModelError("the file has both attn_kv_b and attn_k_b/attn_v_b: which keys and values are "
                                    "meant is ambiguous")
    if m.has_tensor(".attn_k_b.weight") and m("attention.key_length_mla", None) is None:
        raise ValueError("attn_k_b/attn_v_b without attention.key_length_mla (llama.cpp reads the split form only "
                         "with the per-head widths there)")
    if m("attention.temperature_scale", None) is not None:
        raise UnsupportedModelError("attention.temperature_scale (a per-position query temperature) is not supported")
    return {**{k: c[k] for k in ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
                                 "max_position_embeddings", "vocab_size")},
            "num_key_value_heads": c["num_attention_heads"], "kv_lora_rank": int(m("attention.kv_lora_rank")),
            "q_lora_rank": int(m("attention.q_lora_rank")) if latent else None, "qk_rope_head_dim": dr,
            "qk_nope_head_dim": d - dr, "v_head_dim": dv,
            "rms_norm_eps": float(m("attention.layer_norm_rms_epsilon", 1e-6)),
            "rope_theta": float(m("rope.freq_base", 10000.0)), "rope_scaling": deepseek2_yarn(m),
            "attention_bias": m.has_tensor(".attn_q_a.bias") or m.has_tensor(".attn_kv_a_mqa.bias")}


def deepseek2_yarn(m: Meta) -> dict[str, Any] | None:
    """YaRN as llama.cpp's deepseek2 graph applies it: the softmax scale times mscale(factor, mscale_all_dim)²,
    ``rope.scaling.yarn_log_multiplier`` being 0.1 * mscale_all_dim (float32); the rotary part of q and k carries
    no further factor (``attention_factor`` 1: llama.cpp cancels YaRN's own magnitude correction, which transformers
    keeps as mscale(factor, mscale) / mscale(factor, mscale_all_dim), 1 in every released config: the two are equal).
    A stored ``attn_factor`` other than 1 scales the whole logits in llama.cpp but only the rotary part in
    transformers: refused."""
    kind = m("rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind != "yarn":
        raise UnsupportedModelError(f"rope.scaling.type {kind!r} is not supported (none and yarn are)")
    for key in ("rope.scaling.attn_factor", "rope.scaling.yarn_attn_factor"):
        if float(m(key, 1.0)) != 1.0:
            raise UnsupportedModelError(f"{key} {m(key)} is not supported (only 1)")
    out: dict[str, Any] = {"rope_type": "yarn", "factor": float(m("rope.scaling.factor")), "attention_factor": 1.0,
                           "original_max_position_embeddings": int(m("rope.scaling.original_context_length"))}
    log_mul = m("rope.scaling.yarn_log_multiplier", None)
    if log_mul is not None:  # divided back in float32 as llama.cpp does; the shortest decimal of that float32
        import numpy as np

        out["mscale_all_dim"] = float(str(np.float32(log_mul) / np.float32(0.1)))
    for key in ("beta_fast", "beta_slow"):
        if (v := m(f"rope.scaling.yarn_{key}", None)) is not None:
            out[key] = float(v)
    return out


@dataclass(frozen=True)
class Layout:
    """One llama.cpp architecture: the transformers family its attention maps onto, and what the converter did."""

    model_type: str
    architecture: str
    config: Callable[[Meta], dict[str, Any]] = llama_like
    names: Mapping[str, str] = field(default_factory=lambda: LLAMA_NAMES)
    prefix: str = "model.layers"
    permuted_qk: bool = False
    norm_plus_one: bool = False
    qkv: str | None = None  # "same", "transposed" or "grouped" (see the module docstring)
    mla: bool = False  # kv_b_proj may be stored split as attn_k_b / attn_v_b (see the module docstring)


ARCHES: dict[str, Layout] = {
    "llama": Layout("llama", "LlamaForCausalLM", with_bias, permuted_qk=True),  # Llama, Mistral, SmolLM ...
    "granite": Layout("granite", "GraniteForCausalLM", granite, permuted_qk=True),
    "qwen2": Layout("qwen2", "Qwen2ForCausalLM"),
    "qwen3": Layout("qwen3", "Qwen3ForCausalLM"),
    "qwen2moe": Layout("qwen2_moe", "Qwen2MoeForCausalLM"),
    "qwen3moe": Layout("qwen3_moe", "Qwen3MoeForCausalLM"),
    "olmo2": Layout("olmo2", "Olmo2ForCausalLM"),
    "gemma": Layout("gemma", "GemmaForCausalLM", norm_plus_one=True),
    "gemma2": Layout("gemma2", "Gemma2ForCausalLM", gemma2, norm_plus_one=True),
    "gemma3": Layout("gemma3_text", "Gemma3ForCausalLM", gemma3, norm_plus_one=True),
    "stablelm": Layout("stablelm", "StableLmForCausalLM", stablelm),
    "starcoder2": Layout("starcoder2", "Starcoder2ForCausalLM", starcoder2),
    "command-r": Layout("cohere", "CohereForCausalLM", cohere),
    "phi3": Layout("phi3", "Phi3ForCausalLM", names=PHI3_NAMES, qkv="same"),
    "gpt2": Layout("gpt2", "GPT2LMHeadModel", gpt2, names=GPT2_NAMES, prefix="h", qkv="transposed"),
    "bloom": Layout("bloom", "BloomForCausalLM", bloom, names=BLOOM_NAMES, prefix="h", qkv="grouped"),
    "falcon": Layout("falcon", "FalconForCausalLM", falcon, names=BLOOM_NAMES, prefix="h", qkv="grouped"),
    "deepseek2": Layout("deepseek_v2", "DeepseekV2ForCausalLM", deepseek2, names=DEEPSEEK2_NAMES, mla=True),
}


def layer_names(layout: Layout, config: Mapping[str, Any]) -> Mapping[str, str]:
    """GGUF role -> Hugging Face module for one file. Falcon's new architecture has two LayerNorms: gguf's name map
    writes ``ln_attn`` (the one feeding attention) as attn_norm_2 and ``ln_mlp`` as attn_norm."""
    if layout.model_type == "falcon" and config.get("new_decoder_architecture"):
        names = {k: v for k, v in layout.names.items() if k != "attn_norm"}
        return {**names, "attn_norm_2": "ln_attn"}
    return layout.names


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


__all__ = ["ARCHES", "Layout", "Meta", "LLAMA_NAMES", "layer_names"]
