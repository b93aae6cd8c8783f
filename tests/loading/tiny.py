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
