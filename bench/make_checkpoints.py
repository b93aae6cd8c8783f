"""Write synthetic checkpoints of real shapes with random bf16 weights, sharded like the hub's.

Shapes:
  llama-7b        32 layers, d_model 4096, 32 heads (MHA), every tensor of Llama-2-7B (13.5 GB)
  llama-70b-attn  80 layers, d_model 8192, 64 heads, 8 KV heads: attention tensors only (24 GB)
  tiny            4 layers, d_model 256, 8 heads, 2 KV heads (a smoke test of this script)

Tensors are streamed to disk one at a time (the safetensors layout is written by hand), so writing a 24 GB
checkpoint needs a few hundred MB of memory.

Usage: python bench/make_checkpoints.py llama-7b bench/out/llama-7b
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

SHARD_BYTES = 5 * 10**9  # the hub's usual 5 GB shards


@dataclass(frozen=True)
class Shape:
    layers: int
    d_model: int
    heads: int
    kv_heads: int
    d_ff: int
    vocab: int
    attention_only: bool


SHAPES = {
    "llama-7b": Shape(32, 4096, 32, 32, 11008, 32000, attention_only=False),
    "llama-70b-attn": Shape(80, 8192, 64, 8, 28672, 32000, attention_only=True),
    "tiny": Shape(4, 256, 8, 2, 512, 1000, attention_only=False),
}


def config_dict(s: Shape) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": s.d_model,
        "intermediate_size": s.d_ff,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "vocab_size": s.vocab,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    }


def tensor_shapes(s: Shape) -> list[tuple[str, tuple[int, ...]]]:
    """Names and [out, in] shapes in the order a Llama checkpoint stores them."""
    d_head = s.d_model // s.heads
    kv = s.kv_heads * d_head
    out: list[tuple[str, tuple[int, ...]]] = []
    if not s.attention_only:
        out.append(("model.embed_tokens.weight", (s.vocab, s.d_model)))
    for i in range(s.layers):
        p = f"model.layers.{i}"
        out += [
            (f"{p}.input_layernorm.weight", (s.d_model,)),
            (f"{p}.self_attn.q_proj.weight", (s.d_model, s.d_model)),
            (f"{p}.self_attn.k_proj.weight", (kv, s.d_model)),
            (f"{p}.self_attn.v_proj.weight", (kv, s.d_model)),
            (f"{p}.self_attn.o_proj.weight", (s.d_model, s.d_model)),
        ]
        if not s.attention_only:
            out += [
                (f"{p}.post_attention_layernorm.weight", (s.d_model,)),
                (f"{p}.mlp.gate_proj.weight", (s.d_ff, s.d_model)),
                (f"{p}.mlp.up_proj.weight", (s.d_ff, s.d_model)),
                (f"{p}.mlp.down_proj.weight", (s.d_model, s.d_ff)),
            ]
    if not s.attention_only:
        out += [("model.norm.weight", (s.d_model,)), ("lm_head.weight", (s.vocab, s.d_model))]
    return out


def shard(entries: list[tuple[str, tuple[int, ...]]], shard_bytes: int = SHARD_BYTES
          ) -> list[list[tuple[str, tuple[int, ...]]]]:
    shards: list[list] = [[]]
    size = 0
    for name, shape in entries:
        n = 2 * _numel(shape)
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += n
    return shards


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for x in shape:
        n *= x
    return n


def random_bf16(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    if len(shape) == 1:
        return torch.ones(shape, dtype=torch.bfloat16)  # norm gains
    std = shape[1] ** -0.5  # the usual init scale, so metrics see realistic magnitudes
    out = torch.empty(shape, dtype=torch.bfloat16)
    rows = max(1, (64 << 20) // (4 * shape[1]))  # generate in ~64 MB float32 chunks
    for r in range(0, shape[0], rows):
        chunk = torch.randn((min(rows, shape[0] - r), shape[1]), generator=gen) * std
        out[r : r + rows] = chunk.to(torch.bfloat16)
    return out


def write_shard(path: Path, entries: list[tuple[str, tuple[int, ...]]], gen: torch.Generator) -> None:
    """Stream a safetensors file: 8-byte header length, JSON header, then raw little-endian data."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in entries:
        n = 2 * _numel(shape)
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # align the data section to 8 bytes
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _name, shape in entries:
            f.write(random_bf16(shape, gen).view(torch.int16).numpy().tobytes())
    tmp.replace(path)


def make(shape: str | Shape, out: Path, shard_bytes: int = SHARD_BYTES, seed: int = 0) -> Path:
    """Write a checkpoint of `shape` (a name in SHAPES, or a Shape) into the folder `out`; returns `out`."""
    s = SHAPES[shape] if isinstance(shape, str) else shape
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config_dict(s), indent=2))
    shards = shard(tensor_shapes(s), shard_bytes)
    gen = torch.Generator().manual_seed(seed)
    weight_map = {}
    total = 0
    for k, entries in enumerate(shards, 1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        print(f"writing {out / fname} ({len(entries)} tensors)", file=sys.stderr)
        write_shard(out / fname, entries, gen)
        for name, shape in entries:
            weight_map[name] = fname
            total += 2 * _numel(shape)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (out / "DONE").write_text(shape if isinstance(shape, str) else repr(shape))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out", type=Path)
    a = ap.parse_args()
    make(a.shape, a.out)


if __name__ == "__main__":
    main()
