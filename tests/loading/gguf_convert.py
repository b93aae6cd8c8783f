"""Tiny Hugging Face models of each llama.cpp architecture, and their conversion to GGUF as llama.cpp's
convert_hf_to_gguf.py writes it: names through gguf's own TensorNameMap (what the converter's map_tensor_name
uses), values changed as the converter's modify_tensors changes them, metadata through GGUFWriter's add_* methods.

The value changes are written here from the converter's formulas, independently of qkinspect's inverses:
    llama, granite    LlamaModel.permute on q_proj / k_proj rows (k with the KV-head count)
    gemma, gemma2/3   every *norm.weight + 1
    gpt2              c_attn / c_proj / c_fc weights transposed
    bloom             query_key_value: per-head [(head, 3, d)] interleaving into sections [q | k | v]
    falcon            query_key_value: per-KV-group [(group, rep + 2, d)] interleaving into sections [q | k | v]
    deepseek2         kv_b_proj (H*(dn+dv), r) split per head into k_b_proj (H, r, dn) -- each head's k_nope rows
                      transposed -- and v_b_proj (H, dv, r) (DeepseekV2Model.modify_tensors since llama.cpp's MLA
                      change); the LEGACY cases are written as before it: kv_b_proj whole, head widths in
                      key_length / value_length and head_count_kv = n_heads. Routed experts are left out (llama.cpp
                      merges them into 3-D tensors; qkinspect reads attention only).
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.adapters.harness import randomize
from tests.loading.tiny import llama_cpp_permute

SIZES = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             intermediate_size=96, vocab_size=40, max_position_embeddings=32)
RMS = dict(rms_norm_eps=1e-5)
# DeepSeek MLA: widths as in tests/adapters/test_dec_mla.py, one dense layer then one MoE layer
MLA = dict(RMS, num_key_value_heads=4, head_dim=None, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8,
           qk_rope_head_dim=4, v_head_dim=6, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
           moe_intermediate_size=16, first_k_dense_replace=1)
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=8, mscale=1.0,
            mscale_all_dim=1.0, beta_fast=32.0, beta_slow=1.0)  # V3 / R1 / Kimi-K2 style: mscale == mscale_all_dim

# GGUF architecture -> (transformers model_type, config overrides, the llama.cpp arch's norm: "rms" or "ln")
CASES: dict[str, tuple[str, dict, str]] = {
    "llama": ("llama", {**RMS}, "rms"),
    "granite": ("granite", {**RMS, "attention_multiplier": 0.375}, "rms"),  # GGUF stores float32
    "qwen2": ("qwen2", {**RMS}, "rms"),
    "qwen3": ("qwen3", {**RMS, "head_dim": 128}, "rms"),  # transformers' GGUF config has no head_dim: its default
    "qwen2moe": ("qwen2_moe", {**RMS, "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 16,
                               "shared_expert_intermediate_size": 16}, "rms"),
    "qwen3moe": ("qwen3_moe", {**RMS, "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 16},
                 "rms"),
    "olmo2": ("olmo2", {**RMS}, "rms"),
    "gemma": ("gemma", {**RMS, "hidden_size": 48}, "rms"),  # 4 heads x 16 = 64 != d_model 48
    "gemma2": ("gemma2", {**RMS, "hidden_size": 48, "query_pre_attn_scalar": 16, "sliding_window": 8}, "rms"),
    "gemma3": ("gemma3_text", {**RMS, "hidden_size": 48, "query_pre_attn_scalar": 16, "sliding_window": 8,
                               "num_hidden_layers": 6}, "rms"),
    "stablelm": ("stablelm", {"use_qkv_bias": True, "partial_rotary_factor": 0.5, "layer_norm_eps": 1e-5}, "ln"),
    "starcoder2": ("starcoder2", {"use_bias": True, "norm_epsilon": 1e-5}, "ln"),
    "command-r": ("cohere", {"layer_norm_eps": 1e-5}, "ln"),
    "phi3": ("phi3", {**RMS, "pad_token_id": 0}, "rms"),
    "gpt2": ("gpt2", {"n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 32, "n_inner": 96}, "ln"),
    "bloom": ("bloom", {"n_head": 4, "n_layer": 2}, "ln"),
    "falcon": ("falcon", {"num_kv_heads": 2, "new_decoder_architecture": True, "multi_query": False}, "ln"),
    "falcon-7b": ("falcon", {"num_kv_heads": 1, "new_decoder_architecture": False, "multi_query": True}, "ln"),
    "deepseek2": ("deepseek_v2", MLA, "rms"),  # V2: query latent; split k_b / v_b
    "deepseek2-lite": ("deepseek_v2", {**MLA, "q_lora_rank": None}, "rms"),  # V2-Lite: no query latent; kv_b whole
    "deepseek2-v3": ("deepseek_v3", {**MLA, "n_group": 2, "topk_group": 1, "rope_parameters": YARN}, "rms"),
}
NOT_IN_TRANSFORMERS_GGUF = {"granite", "olmo2", "gemma", "command-r",  # transformers' GGUF loader lacks these
                            "deepseek2", "deepseek2-lite", "deepseek2-v3"}
VARIANTS = {"falcon-7b": "falcon", "deepseek2-lite": "deepseek2", "deepseek2-v3": "deepseek2"}
LEGACY = {"deepseek2-lite"}  # written as llama.cpp's converter wrote deepseek2 before its MLA change


def gguf_arch(case: str) -> str:
    """The GGUF architecture of a case (a variant such as "falcon-7b", Falcon's multi-query form, names its own)."""
    return VARIANTS.get(case, case)


def tiny_model(case: str, seed: int = 0):
    """(config, causal-LM model with random weights and gains) of a GGUF architecture's transformers family."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, overrides, _ = CASES[case]
    kw = {**SIZES, **overrides}
    if model_type in ("gpt2", "bloom", "falcon"):
        kw = {k: v for k, v in kw.items() if k not in ("num_key_value_heads", "head_dim", "intermediate_size")}
        if model_type == "falcon":
            kw["num_attention_heads"] = 4
    if model_type == "bloom":
        kw.pop("max_position_embeddings")
    kw = {k: v for k, v in kw.items() if v is not None or k == "q_lora_rank"}
    config = AutoConfig.for_model(model_type, **kw)
    torch.manual_seed(seed)
    return config, randomize(AutoModelForCausalLM.from_config(config), seed=seed)


def converted(case: str, name: str, t: torch.Tensor, config) -> list[tuple[str, torch.Tensor]]:
    """What convert_hf_to_gguf.py's modify_tensors makes of one tensor: (Hugging Face name, tensor) pairs."""
    if gguf_arch(case) == "deepseek2" and case not in LEGACY and name.endswith("kv_b_proj.weight"):
        H, dn, dv = config.num_attention_heads, config.qk_nope_head_dim, config.v_head_dim
        kv_b = t.reshape(H, dn + dv, t.shape[-1])  # (H*(dn+dv), r) -> (H, dn+dv, r)
        k_b, v_b = kv_b[:, :dn], kv_b[:, dn:]  # (H, dn, r), (H, dv, r)
        return [(name.replace("kv_b_proj", "k_b_proj"), k_b.transpose(1, 2)),  # (H, r, dn): GGUF [dn, r, H]
                (name.replace("kv_b_proj", "v_b_proj"), v_b)]  # GGUF [r, dv, H]
    return [(name, modify(case, name, t, config))]


def modify(case: str, name: str, t: torch.Tensor, config) -> torch.Tensor:
    """What convert_hf_to_gguf.py's modify_tensors does to one tensor of this architecture."""
    arch = gguf_arch(case)
    H = config.num_attention_heads
    if arch in ("llama", "granite") and name.endswith(("q_proj.weight", "q_proj.bias")):
        return llama_cpp_permute(t, H, H)
    if arch in ("llama", "granite") and name.endswith(("k_proj.weight", "k_proj.bias")):
        return llama_cpp_permute(t, H, config.num_key_value_heads)
    if arch.startswith("gemma") and name.endswith("norm.weight"):
        return t + 1
    if arch == "gpt2" and name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
        return t.T
    if arch in ("bloom", "falcon") and "query_key_value" in name:
        G = H if arch == "bloom" else (config.num_kv_heads if config.new_decoder_architecture else
                                       1 if config.multi_query else H)
        d = config.hidden_size // H
        qkv = t.reshape(G, H // G + 2, d, *t.shape[1:])  # the converter's view(n_head_kv, n_head // n_head_kv + 2, ..)
        q = qkv[:, :-2].reshape(H * d, *t.shape[1:])
        k, v = qkv[:, -2].reshape(G * d, *t.shape[1:]), qkv[:, -1].reshape(G * d, *t.shape[1:])
        return torch.cat([q, k, v])
    return t


def write_meta(w, case: str, config) -> None:
    """The hyper-parameters, as the converter's set_gguf_parameters writes them (the subset qkinspect reads)."""
    model_type, _, norm = CASES[case]
    c = config
    if gguf_arch(case) == "deepseek2":
        return write_mla_meta(w, case, c)
    H = c.num_attention_heads
    G = {"gpt2": H, "bloom": H}.get(model_type) or getattr(c, "num_key_value_heads", None) or H
    if model_type == "falcon":
        G = c.num_kv_heads if c.new_decoder_architecture else 1 if c.multi_query else H
    d = getattr(c, "head_dim", None) or c.hidden_size // H
    w.add_block_count(c.num_hidden_layers)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(getattr(c, "intermediate_size", None) or 4 * c.hidden_size)
    w.add_head_count(H)
    w.add_head_count_kv(G)
    w.add_context_length(getattr(c, "max_position_embeddings", None) or 2048)
    w.add_vocab_size(c.vocab_size)
    w.add_pad_token_id(0)  # transformers' GGUF loader takes pad_token_id from here (Phi-3's default is 32000)
    if model_type not in ("gpt2", "bloom", "falcon"):
        w.add_key_length(d)
        w.add_value_length(d)
        rope = getattr(c, "rope_parameters", None) or {}
        rope = rope.get("full_attention", rope)
        w.add_rope_freq_base(float(rope.get("rope_theta", 10000.0)))
        w.add_rope_dimension_count(int(d * rope.get("partial_rotary_factor", 1.0)))
    if norm == "rms":
        w.add_layer_norm_rms_eps(c.rms_norm_eps)
    else:
        w.add_layer_norm_eps(1e-5)
    if model_type == "granite":
        w.add_attention_scale(c.attention_multiplier)
    if model_type in ("gemma2", "gemma3_text"):
        w.add_sliding_window(c.sliding_window)
    if model_type == "gemma2":
        w.add_attn_logit_softcapping(c.attn_logit_softcapping)
        w.add_final_logit_softcapping(c.final_logit_softcapping)
    if model_type == "cohere":
        w.add_logit_scale(c.logit_scale)


def write_mla_meta(w, case: str, c) -> None:
    """DeepseekV2Model.set_gguf_parameters (and TextModel's, which it extends): since llama.cpp's MLA change the
    attention is written as MQA over the latent (head_count_kv 1, key_length kv_lora_rank + rope, value_length
    kv_lora_rank) with the per-head widths in key_length_mla / value_length_mla; before it (LEGACY), as MHA."""
    import gguf

    H, dn, dr, dv, r = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank
    legacy = case in LEGACY
    rope = c.rope_parameters
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(H)
    w.add_head_count_kv(H if legacy else 1)
    w.add_rope_freq_base(float(rope["rope_theta"]))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_leading_dense_block_count(c.first_k_dense_replace)
    w.add_vocab_size(c.vocab_size)
    if c.q_lora_rank is not None:
        w.add_q_lora_rank(c.q_lora_rank)
    w.add_kv_lora_rank(r)
    if legacy:
        w.add_key_length(dn + dr)
        w.add_value_length(dv)
    else:
        w.add_key_length(r + dr)
        w.add_value_length(r)
        w.add_key_length_mla(dn + dr)
        w.add_value_length_mla(dv)
    w.add_expert_feed_forward_length(c.moe_intermediate_size)
    w.add_expert_count(c.n_routed_experts)
    w.add_expert_shared_count(c.n_shared_experts)
    w.add_rope_dimension_count(dr)
    if rope.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
        w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])


def write_gguf(path: Path, case: str, config, model, qtype=None) -> Path:
    """The model converted as llama.cpp converts it, F32 throughout (so that the comparisons can be exact), or with
    every matrix whose rows fit its blocks quantised to `qtype` (vectors stay F32, as llama-quantize keeps them)."""
    import gguf

    arch = gguf_arch(case)
    model_arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch]
    names = gguf.get_tensor_name_map(model_arch, config.num_hidden_layers)
    w = gguf.GGUFWriter(str(path), arch)
    write_meta(w, case, config)
    for hf, t in model.state_dict().items():
        for name, value in converted(case, hf, t.detach(), config):
            new = names.get_name(name, try_suffixes=(".weight", ".bias"))
            if new is None or new in w.tensors[0]:
                continue  # rotary buffers, tied output, single experts ...
            a = value.float().contiguous().numpy()
            if qtype is not None and a.ndim > 1 and a.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0] == 0:
                w.add_tensor(new, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
            else:
                w.add_tensor(new, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
