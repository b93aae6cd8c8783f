"""A tiny Llama GGUF that transformers loads as a causal LM: the weights of `tiny_models.llama` written as
llama.cpp writes them (q/k rows permuted, llama.cpp's names), with a byte-level BPE tokenizer in its metadata
(GPT-2's byte alphabet, a few merges). `meta` overrides tokenizer metadata (hostile cases)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.loading.tiny import llama_cpp_permute

H, G, LAYERS = 4, 2, 2


def byte_tokens() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return ["<unk>", "<s>", "</s>", *sorted(set(bytes_to_unicode().values())), "th", "Ġt", "he"]


MERGES = ["t h", "Ġ t", "h e"]


def llama_gguf(path: Path, seed: int = 0, **meta: Any) -> Path:
    """Write the GGUF; `meta`: tokenizer.ggml.* values replacing the true ones (None leaves a key out)."""
    import gguf
    import numpy as np
    from transformers import LlamaConfig, LlamaForCausalLM

    tokens = byte_tokens()
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=LAYERS, num_attention_heads=H, num_key_value_heads=G,
                      head_dim=16, intermediate_size=96, vocab_size=len(tokens), max_position_embeddings=64,
                      rms_norm_eps=1e-5, tie_word_embeddings=False)
    sd = {k: v.detach() for k, v in LlamaForCausalLM(cfg).state_dict().items()}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_block_count(LAYERS)
    w.add_embedding_length(64)
    w.add_feed_forward_length(96)
    w.add_head_count(H)
    w.add_head_count_kv(G)
    w.add_key_length(16)
    w.add_value_length(16)
    w.add_rope_dimension_count(16)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_context_length(64)
    w.add_vocab_size(len(tokens))
    tok = {"model": "gpt2", "tokens": tokens, "token_type": [3, 3, 3] + [1] * (len(tokens) - 3),
           "merges": MERGES, "bos_token_id": 1, "eos_token_id": 2, "unknown_token_id": 0}
    tok.update(meta)
    empty = tok.get("tokens") == []
    if empty:  # GGUFWriter refuses an empty array: written with one token, then cut out (`_empty_tokens`)
        tok["tokens"] = ["x"]
    for key, value in tok.items():
        if value is None:
            continue
        name = f"tokenizer.ggml.{key}"
        if isinstance(value, str):
            w.add_string(name, value)
        elif isinstance(value, list):
            w.add_array(name, value)
            if empty and key == "tokens":
                w.add_string("qk.pad", "a")
        elif isinstance(value, int) and value < 2**32:
            w.add_uint32(name, value)
        else:
            w.add_uint64(name, value)

    def add(name: str, t: torch.Tensor) -> None:
        w.add_tensor(name, t.float().numpy().astype(np.float32))

    add("token_embd.weight", sd["model.embed_tokens.weight"])
    add("output_norm.weight", sd["model.norm.weight"])
    add("output.weight", sd["lm_head.weight"])
    roles = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output"}
    mlp = {"gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        for proj, role in roles.items():
            t = sd[f"{p}.self_attn.{proj}.weight"]
            if proj in ("q_proj", "k_proj"):
                t = llama_cpp_permute(t, H, H if proj == "q_proj" else G)
            add(f"blk.{i}.{role}.weight", t)
        for proj, role in mlp.items():
            add(f"blk.{i}.{role}.weight", sd[f"{p}.mlp.{proj}.weight"])
        add(f"blk.{i}.attn_norm.weight", sd[f"{p}.input_layernorm.weight"])
        add(f"blk.{i}.ffn_norm.weight", sd[f"{p}.post_attention_layernorm.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if empty:
        _empty_tokens(path)
    return path


def _empty_tokens(path: Path) -> None:
    """Make the one-token list empty, keeping every offset: the 9 bytes of its string move into ``qk.pad``."""
    import struct

    data = bytearray(path.read_bytes())
    key = b"tokenizer.ggml.tokens"
    at = data.index(key) + len(key) + 8  # after the value type (u32) and the element type (u32)
    assert struct.unpack_from("<Q", data, at)[0] == 1
    struct.pack_into("<Q", data, at, 0)
    del data[at + 8:at + 17]  # the string: its length (u64) and "x"
    pad = data.index(b"qk.pad") + len(b"qk.pad") + 4  # after the value type: the string's length
    struct.pack_into("<Q", data, pad, 10)
    data[pad + 8:pad + 8] = b"a" * 9
    path.write_bytes(bytes(data))
