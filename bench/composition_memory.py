"""Peak memory of `qkinspect.composition` on layers of Llama-2-7B width, in one run.

A model in memory (a (config, state_dict) pair: `LAYERS` layers of 32 heads x 128 over d_model 4096, random bf16
weights, as a 7B checkpoint stores them) is composed with the earlier layers held `--held` MiB at a time (the
default 256 MiB holds 4 such layers; less makes several chunks). Printed: the time, the peak RSS (this process's
VmHWM), the RSS before composing (torch, and the weights held in memory) and the difference: what composing adds,
whatever the number of pairs.

Usage: python bench/composition_memory.py [--layers 4] [--held 256]
"""

from __future__ import annotations

import argparse
import time

import torch


def rss(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--held", type=int, default=256, help="MiB of earlier layers held at once")
    a = ap.parse_args()
    from transformers import LlamaConfig

    import qkinspect
    from qkinspect.composition import run as composing

    composing.HELD_BYTES = a.held << 20
    D = 4096
    cfg = LlamaConfig(hidden_size=D, num_attention_heads=32, num_key_value_heads=32, num_hidden_layers=a.layers,
                      intermediate_size=16, vocab_size=8, head_dim=128)
    g = torch.Generator().manual_seed(0)
    state = {}
    for i in range(a.layers):
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            state[f"model.layers.{i}.self_attn.{n}.weight"] = (torch.randn(D, D, generator=g) * 0.02).bfloat16()
        state[f"model.layers.{i}.input_layernorm.weight"] = torch.ones(D, dtype=torch.bfloat16)
    before = rss("VmRSS")
    t0 = time.perf_counter()
    r = qkinspect.composition((cfg, state))
    took = time.perf_counter() - t0
    peak = rss("VmHWM")
    print(f"{a.layers} layers of 7B width, {len(r.scores)} (layer pair, kind) score arrays, earlier layers held "
          f"{a.held} MiB at a time: {took:.1f} s; peak RSS {peak / 2**30:.2f} GiB, {before / 2**30:.2f} GiB before "
          f"composing (torch and the bf16 weights in memory): +{(peak - before) / 2**30:.2f} GiB composing")


if __name__ == "__main__":
    main()
