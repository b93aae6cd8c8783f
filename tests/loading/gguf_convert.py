"""Tiny Hugging Face models of each llama.cpp architecture, and their conversion to GGUF as llama.cpp's
convert_hf_to_gguf.py writes it: names through gguf's own TensorNameMap (what the converter's map_tensor_name
uses), values changed as the converter's modify_tensors changes them, metadata through GGUFWriter's add_* methods.

The value changes are written here from the converter's formulas, independently of qkinspect's inverses:
    llama, granite    LlamaModel.permute on q_proj / k_proj rows (k with the KV-head count)
    gemma, gemma2/3   every *norm.weight + 1
    gpt2              c_attn / c_proj / c_fc weights transposed
    bloom             query_key_value: per-head [(head, 3, d)] interleaving into sections [q | k | v]
    falcon            query_key_value: per-KV-group [(group, rep + 2, d)] interleaving into sections [q | k | v]
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.adapters.harness import randomize
from tests.loading.tiny import llama_cpp_permute

SIZES = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             intermediate_size=96, vocab_size=40, max_position_embeddings=32)
RMS = dict(rms_norm_eps=1e-5)

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
}
NOT_IN_TRANSFORMERS_GGUF = {"granite", "olmo2", "gemma", "command-r"}  # transformers' GGUF loader lacks these


def gguf_arch(case: str) -> str:
    """The GGUF architecture of a case ("falcon-7b" is Falcon's multi-query variant)."""
    return case.removesuffix("-7b")


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
    config = AutoConfig.for_model(model_type, **kw)
    torch.manual_seed(seed)
    return config, randomize(AutoModelForCausalLM.from_config(config), seed=seed)


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


def write_gguf(path: Path, case: str, config, model) -> Path:
    """The model converted as llama.cpp converts it, F32 throughout (so that the comparisons can be exact)."""
    import gguf

    arch = gguf_arch(case)
    model_arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch]
    names = gguf.get_tensor_name_map(model_arch, config.num_hidden_layers)
    w = gguf.GGUFWriter(str(path), arch)
    write_meta(w, case, config)
    for name, t in model.state_dict().items():
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None or new in w.tensors[0]:
            continue  # rotary buffers, tied output ...
        w.add_tensor(new, modify(case, name, t.detach(), config).float().contiguous().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
