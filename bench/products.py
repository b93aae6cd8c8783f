"""Time the product routes on the 7B shape, in memory, and print their ratios in one run.

Per Gram (32 heads, d_model 4096, d_head 128: W_Qᵀ W_Q) and per 7B layer (the eight products of the default
metrics, `qkinspect.metrics.products.layer_products`), best of several:
  float32        torch on weights already cast to float32 (the cast done elsewhere, e.g. in the loader's thread)
  float32 + cast the same with the bf16 -> float32 cast of the weights it reads
  bf16           MKL's bf16-in, float32-out GEMM reading the bf16 weights directly (forced, whatever the CPU)

Usage: python bench/products.py [--repeats 5] [--heads 32 --kv-heads 32 --d-model 4096 --d-head 128]
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import torch

from qkinspect.metrics import backend
from qkinspect.metrics.products import layer_products


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def best_of(fn, repeats: int) -> float:
    fn()  # warm-up: first-call set-up (MKL, page faults) is not the steady state
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def heads(n: int, D: int, d: int, g: torch.Generator) -> torch.Tensor:
    """(n, D, d) bf16 in the layout qkinspect holds a projection in: a transposed view of the stored (n*d, D)."""
    return (torch.randn(n * d, D, generator=g) * 0.02).bfloat16().view(n, d, D).mT


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=32)
    ap.add_argument("--d-model", type=int, default=4096)
    ap.add_argument("--d-head", type=int, default=128)
    a = ap.parse_args()
    H, G, D, d = a.heads, a.kv_heads, a.d_model, a.d_head
    flags = backend._cpu_flags()
    units = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    print(f"CPU: {cpu_name()} ({', '.join(units) or 'no flags read'}); torch threads {torch.get_num_threads()}; "
          f"auto route here: {backend.best_route()}")
    if not backend.available():
        print(f"the bf16 route cannot run here: {backend._unavailable()}")
        return
    g = torch.Generator().manual_seed(0)
    Q, K, V = heads(H, D, d, g), heads(G, D, d, g), heads(G, D, d, g)
    Qf, Kf, Vf = (X.float() for X in (Q, K, V))
    Rq, Rk = (torch.linalg.cholesky(X.mT @ X).mT[torch.arange(H) // (H // G)] for X in (Qf, Kf))  # (H, d, d)

    gram = {"float32": best_of(lambda: Qf.mT @ Qf, a.repeats),
            "float32 + cast": best_of(lambda: (lambda X: X.mT @ X)(Q.float()), a.repeats),
            "bf16": best_of(lambda: backend.matmul(Q.mT, Q), a.repeats)}
    layer = {"float32": best_of(lambda: layer_products(Qf, Kf, Vf, Rq, Rk, "float32"), a.repeats),
             "float32 + cast": best_of(lambda: layer_products(Q, K, V, Rq, Rk, "float32"), a.repeats),
             "bf16": best_of(lambda: layer_products(Q, K, V, Rq, Rk, "bf16"), a.repeats)}
    for label, t in (("per Gram", gram), (f"per layer (8 products, {H} heads, {G} KV heads)", layer)):
        cells = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in t.items())
        print(f"{label} (D={D}, d={d}): {cells}; float32/bf16 = {t['float32'] / t['bf16']:.2f}, "
              f"(float32 + cast)/bf16 = {t['float32 + cast'] / t['bf16']:.2f}")


if __name__ == "__main__":
    main()
