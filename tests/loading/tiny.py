"""Tiny checkpoints written in code: a BERT and a Llama, in every layout the loader reads."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, vocab_size=50,
            max_position_embeddings=16)
LLAMA = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             intermediate_size=96, vocab_size=40, max_position_embeddings=32, rms_norm_eps=1e-5,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def bert(seed: int = 0, **overrides):
    """(config, state dict) of a randomly initialised tiny BertModel."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(**{**BERT, **overrides})
    model = BertModel(config).eval()
    return config, {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


def llama(seed: int = 0, **overrides):
    """(config, state dict) of a randomly initialised tiny LlamaModel (grouped-query: 4 heads, 2 KV heads)."""
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(seed)
    config = LlamaConfig(**{**LLAMA, **overrides})
    model = LlamaModel(config).eval()
    # Random norm gains, so a mix-up between tensors cannot hide behind all-ones vectors.
    with torch.no_grad():
        for m in model.modules():
            if type(m).__name__.endswith("RMSNorm"):
                m.weight.uniform_(0.5, 1.5)
    return config, {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


def write(folder: Path, config, state: dict, fmt: str = "safetensors", shards: int = 1, prefix: str = "") -> Path:
    """Write config.json and the weights as `fmt` ("safetensors" or "bin"), split into `shards` files by layer."""
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    state = {prefix + k: v for k, v in state.items()}
    if shards == 1:
        _save(state, folder / ("model.safetensors" if fmt == "safetensors" else "pytorch_model.bin"), fmt)
        return folder
    parts = _split(state, shards)
    ext = "safetensors" if fmt == "safetensors" else "bin"
    stem = "model" if fmt == "safetensors" else "pytorch_model"
    weight_map = {}
    for j, part in enumerate(parts):
        name = f"{stem}-{j + 1:05d}-of-{shards:05d}.{ext}"
        _save(part, folder / name, fmt)
        weight_map.update({k: name for k in part})
    (folder / f"{stem}.{ext}.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def _split(state: dict, shards: int) -> list[dict]:
    """Layer i goes to shard min(i, shards - 1); tensors outside the layers go to the first shard."""
    parts: list[dict] = [{} for _ in range(shards)]
    for k, v in state.items():
        layer = _layer_of(k)
        parts[0 if layer is None else min(layer, shards - 1)][k] = v
    return parts


def _layer_of(name: str) -> int | None:
    bits = name.split(".")
    for a, b in zip(bits, bits[1:], strict=False):
        if a in ("layer", "layers") and b.isdigit():
            return int(b)
    return None


def _save(state: dict, path: Path, fmt: str) -> None:
    if fmt == "safetensors":
        save_file(state, str(path))
    else:
        torch.save(state, path)


def tree(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under `folder` with its size and mtime: to show that nothing was written."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}


# -- GGUF, written the way llama.cpp's convert_hf_to_gguf.py writes it ------------------------------------------


def llama_cpp_permute(w, n_head: int, n_head_kv: int | None):
    """LlamaModel.permute from llama.cpp's converter, verbatim in effect: applied to q (n_head, n_head) and
    k (n_head, n_head_kv) rows before writing."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_by_index(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse, written row by row (independent of the loader's reshape): HF row h*d + j*d/2 + i is
    llama.cpp row h*d + 2*i + j."""
    d = w.shape[0] // n_heads
    order = [h * d + 2 * i + j for h in range(n_heads) for j in range(2) for i in range(d // 2)]
    return w[order]


GGUF_ROLES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output"}


def write_gguf(path: Path, config, state: dict, arch: str = "llama", permute: bool = True, qtype=None,
               meta: bool = True, name: str | None = None) -> Path:
    """Write a Llama-layout state dict as GGUF: metadata from `config` (and `name` as general.name), q/k permuted
    as llama.cpp does, tensors as F32 or quantised to `qtype`."""
    import gguf
    import numpy as np

    H, G = config.num_attention_heads, config.num_key_value_heads
    w = gguf.GGUFWriter(str(path), arch)
    if name is not None:
        w.add_name(name)
    if meta:
        w.add_block_count(config.num_hidden_layers)
        w.add_embedding_length(config.hidden_size)
        w.add_feed_forward_length(config.intermediate_size)
        w.add_head_count(H)
        w.add_head_count_kv(G)
        w.add_key_length(config.head_dim)
        w.add_value_length(config.head_dim)
        w.add_rope_dimension_count(config.head_dim)
        w.add_rope_freq_base(config.rope_parameters["rope_theta"])
        w.add_layer_norm_rms_eps(config.rms_norm_eps)
        w.add_context_length(config.max_position_embeddings)
        w.add_vocab_size(config.vocab_size)

    def add(name: str, t: torch.Tensor) -> None:
        a = t.float().numpy().astype(np.float32)
        if qtype is None or a.ndim == 1:
            w.add_tensor(name, a)
        else:
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)

    add("token_embd.weight", state["embed_tokens.weight"])
    for i in range(config.num_hidden_layers):
        p = f"layers.{i}"
        for proj, role in GGUF_ROLES.items():
            for kind in ("weight", "bias"):
                t = state.get(f"{p}.self_attn.{proj}.{kind}")
                if t is None:
                    continue
                if permute and proj in ("q_proj", "k_proj"):
                    t = llama_cpp_permute(t, H, H if proj == "q_proj" else G)
                add(f"blk.{i}.{role}.{kind}", t)
        add(f"blk.{i}.attn_norm.weight", state[f"{p}.input_layernorm.weight"])
        add(f"blk.{i}.ffn_norm.weight", state[f"{p}.post_attention_layernorm.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
