"""Benchmark qkinspect against the read floor, the compute floor and the naive dense route, in one run.

  (a) read floor: every q/k/v/o tensor read with safe_open and its bytes touched; (a') the part of it spent on
      the q/k/v tensors, the bytes the default metrics need (`analyze` does not read W_O for them)
  (b) `qkinspect analyze` (default metrics, all heads) as a subprocess; wall time, peak RSS (its VmHWM) and CPU
      time (user + system: on n cores the wall time cannot go below CPU / n, so a wall time well above that says
      other processes held the cores)
  (c) naive: dense per-head W_QK = W_Q W_K^T with torch.linalg.svdvals and eigvals, timed on a sample of heads
      and scaled to the model
  (d) the compute floor of the default metrics: only the eight batched products per layer that they cannot do
      without (the Grams of W_Q, W_K, W_V; W_K^T W_Q, W_V^T W_Q, W_V^T W_K; W_Q R_K^T and W_K R_Q^T for
      directionality's row and column norms), on tensors already in memory, for each exact product route the
      machine has (`product_routes`: the float32 route always) and each way `analyze` may schedule the layers
      (one at a time with torch's threads; and, where `analyze` does so here, two or more side by side on worker
      threads with a share of them each); (d_best) is the fastest
  (e) the start-up floor: a Python process that imports torch and qkinspect's loader and exits

The bound: `analyze` must start (e), then read the q/k/v tensors and do the products, which overlap (the next
layer is read while the current one is measured), so (b) >= (e) + max((a'), (d_best)). The targets (issue 17),
printed with PASS/FAIL:
  (b) / ((e) + max((a'), (d_best))) <= 1.25, cold
  peak RSS <= 1.5 GiB on the Llama-2-7B shape; <= 2.5 GiB on the 70B attention-only shape

  (f) the cost of detecting heads that float32 cannot resolve (docs/metrics.md, Numerics): the default metrics of
      layers of the checkpoint's shape (Gaussian weights, every head on the fast route), in memory, timed with the
      detection and with it switched off (no head ever recomputed), interleaved, best of several; needs no
      checkpoint: `python bench/run.py --detection llama-7b --layers 4`

Each of (a) and (b) is timed twice: with the checkpoint's pages evicted from the page cache first
(posix_fadvise DONTNEED: a cold read from disk, as on a laptop opening a checkpoint; the row the targets are judged
on) and with them cached.

Usage:
  python bench/make_checkpoints.py llama-7b bench/out/llama-7b
  python bench/run.py bench/out/llama-7b [--naive-heads 2]
  python bench/run.py --detection llama-7b [--layers 4 --repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from qkinspect.layer import BlockSpec

ATTN = re.compile(r"\.self_attn\.(q|k|v|o)_proj\.weight$")


def shards(folder: Path) -> dict[str, list[str]]:
    """shard file -> attention tensor names in it."""
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    out: dict[str, list[str]] = {}
    for name, f in index.items():
        if ATTN.search(name):
            out.setdefault(f, []).append(name)
    return out


def evict(folder: Path) -> None:
    """Drop the checkpoint's pages from the page cache (no root needed for our own files)."""
    for f in folder.glob("*.safetensors"):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(folder: Path) -> None:
    for f in folder.glob("*.safetensors"):
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass


def touch(t: torch.Tensor) -> int:
    """Read every byte of `t` (a reduction over all of it as 8-byte words, or 1-byte ones when the size is odd):
    a tensor backed by a file mapping is only read from disk when its pages are touched."""
    flat = t.contiguous().reshape(-1).view(torch.uint8)  # (numel * itemsize,) bytes, a view of the same memory
    words = flat.view(torch.int64) if flat.numel() % 8 == 0 else flat
    return int(words.sum())


def read_floor(folder: Path) -> tuple[float, float, int]:
    """Seconds to read every attention tensor with safe_open and touch its bytes; the seconds of that spent on the
    q/k/v tensors alone (what the default metrics read: not W_O); bytes read."""
    from safetensors import safe_open

    t0 = time.perf_counter()
    qkv = 0.0
    nbytes = 0
    for f, names in shards(folder).items():
        with safe_open(str(folder / f), framework="pt") as h:
            for name in names:
                t1 = time.perf_counter()
                t = h.get_tensor(name)  # may be backed by the file mapping: nothing read yet
                touch(t)  # so every byte is read here
                if ATTN.search(name).group(1) != "o":
                    qkv += time.perf_counter() - t1
                nbytes += t.numel() * t.element_size()
    return time.perf_counter() - t0, qkv, nbytes


# Runs `python -m qkinspect ...` and reports the peak resident set of its own memory (VmHWM, which exec resets).
# Not ru_maxrss from wait4: Linux carries a process's maximum over fork/vfork and exec, so a child of this
# benchmark would report this process's peak (it touched the whole checkpoint while timing the read floor).
_PEAK_WRAPPER = """
import runpy, sys
sys.argv = ["qkinspect", *sys.argv[1:]]
try:
    runpy.run_module("qkinspect", run_name="__main__", alter_sys=True)
finally:
    hwm = [line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")]
    print("peak-rss-kib", *hwm, file=sys.stderr)
"""


def run_analyze(folder: Path, extra: list[str]) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (user + system) and peak RSS (GiB) of `qkinspect analyze` in a child process."""
    cmd = [sys.executable, "-c", _PEAK_WRAPPER, "analyze", str(folder), "--format", "json", *extra]
    with tempfile.TemporaryFile() as err:  # a file, not a pipe: a full pipe would block the child
        t0 = time.perf_counter()
        child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - t0
        child.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = err.read().decode(errors="replace")
    if child.returncode != 0:
        raise SystemExit(f"qkinspect analyze failed:\n{text}")
    peak = [line.split()[1] for line in text.splitlines() if line.startswith("peak-rss-kib")]
    return wall, usage.ru_utime + usage.ru_stime, int(peak[-1]) / 2**20  # KiB -> GiB


def naive_per_head(folder: Path, n_sample: int) -> float:
    """Seconds per head for the dense route, measured on `n_sample` heads of layer 0."""
    from safetensors import safe_open

    cfg = json.loads((folder / "config.json").read_text())
    H, G, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    d = D // H
    where = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    p = "model.layers.0.self_attn"
    with safe_open(str(folder / where[f"{p}.q_proj.weight"]), framework="pt") as h:
        Wq = h.get_tensor(f"{p}.q_proj.weight").float()  # (H*d, D)
    with safe_open(str(folder / where[f"{p}.k_proj.weight"]), framework="pt") as h:
        Wk = h.get_tensor(f"{p}.k_proj.weight").float()  # (G*d, D)
    t0 = time.perf_counter()
    for h in range(n_sample):
        g = h // (H // G)
        M = Wq[h * d : (h + 1) * d].T @ Wk[g * d : (g + 1) * d]  # (D, D) = W_Q^h W_K^g^T
        torch.linalg.svdvals(M)
        torch.linalg.eigvals(M)
    return (time.perf_counter() - t0) / n_sample


def product_routes() -> dict[str, torch.dtype]:
    """The exact product routes this machine has: name -> the dtype the products read the weights in.

    float32 (torch's products of the cast weights) is always there and always measured. A route the product
    backend (qkinspect.metrics.backend, issue 17) selects on this machine is added beside it: its bf16-in,
    float32-out GEMMs read the bf16 weights directly."""
    from qkinspect.metrics import backend

    routes = {"float32": torch.float32}
    if backend.best_route() == "bf16":
        routes["bf16"] = torch.bfloat16
    return routes


def gemm_floor(folder: Path, route: str = "float32", dtype: torch.dtype = torch.float32, at_once: int = 1) -> float:
    """(d): seconds of the eight batched products per layer that the default metrics need, summed over layers,
    on the product route `route` (weights in `dtype`: float32 cast from bf16, or bf16 as stored), `at_once`
    layers at a time: one layer with torch's threads, or several side by side on worker threads with an equal share
    of them each (`qkinspect.metrics.factored.worker_pool`), as `analyze` schedules layers that fit together.

    Each layer's q/k/v weights are read (and cast) untimed; only the products are timed (best of two).
    Query heads pair with KV head h // (H // G), as in qkinspect; a random d x d factor stands in for R_K and R_Q
    (the cost of a product does not depend on its values)."""
    from safetensors import safe_open

    from qkinspect.metrics import factored
    from qkinspect.metrics.products import layer_products

    cfg = json.loads((folder / "config.json").read_text())
    H, G, D, n_layers = (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"],
                         cfg["num_hidden_layers"])
    d = D // H
    where = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]

    def read(i: int, p: str, n: int) -> torch.Tensor:
        name = f"model.layers.{i}.self_attn.{p}_proj.weight"
        with safe_open(str(folder / where[name]), framework="pt") as h:
            return h.get_tensor(name).to(dtype).view(n, d, D).mT  # (n*d, D) -> (n, D, d), as qkinspect holds it

    R = torch.randn(H, d, d)
    pool = factored.worker_pool(at_once, max(1, torch.get_num_threads() // at_once)) if at_once > 1 else None

    def products(layer: tuple[torch.Tensor, ...]) -> None:
        layer_products(*layer, R, R, route)  # the eight products, as `analyze` forms them

    total = 0.0
    for i in range(0, n_layers, at_once):
        group = [(read(j, "q", H), read(j, "k", G), read(j, "v", G)) for j in range(i, min(i + at_once, n_layers))]
        best = float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            if pool is None:
                products(group[0])
            else:
                list(pool.map(products, group))
            best = min(best, time.perf_counter() - t0)
        total += best
    return total


def layers_at_once(cfg: dict) -> int:
    """How many of this checkpoint's layers `analyze` measures side by side here (qkinspect.analysis's rule for
    the default metrics in float32)."""
    from qkinspect.analysis import engine as analysis

    d = cfg["hidden_size"] // cfg["num_attention_heads"]
    spec = BlockSpec("decoder", cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
                     cfg["hidden_size"], d)
    run = SimpleNamespace(device="cpu", dtype=torch.float32, needs_o=False)
    return analysis._layers_at_once(run, [spec], cfg["num_hidden_layers"])


def startup_floor() -> float:
    """(e): wall seconds of a Python process that imports torch and qkinspect's loader, best of three."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch, qkinspect.loading"], check=True)
        best = min(best, time.perf_counter() - t0)
    return best


def detection_cost(shape: str, n_layers: int, repeats: int) -> tuple[float, float, int]:
    """(f): seconds for the default metrics of `n_layers` layers of `shape` (bf16 Gaussian weights, as the
    synthetic checkpoints hold them), with the detection of unresolved heads and without it (best of `repeats`,
    the two interleaved so that both see the same machine); and the heads the detection sent to float64."""
    from unittest import mock

    from bench.make_checkpoints import SHAPES
    from qkinspect.layer import AttentionLayer, BlockSpec
    from qkinspect.metrics.heads import HEAD_METRICS, measure_products
    from qkinspect.metrics.products import HeadProducts
    from qkinspect.metrics.registry import resolve_metrics

    s = SHAPES[shape]
    H, G, D = s.heads, s.kv_heads, s.d_model
    d = D // H
    spec = BlockSpec(name="decoder", n_layers=n_layers, n_heads=H, n_kv_heads=G, d_model=D, d_head=d)
    gen = torch.Generator().manual_seed(0)
    w = lambda n: (torch.randn(n, D, d, generator=gen) / D**0.5).bfloat16()  # noqa: E731  (n, D, d)
    layers = [AttentionLayer(spec=spec, layer=i, W_Q=w(H), W_K=w(G), W_V=w(G)) for i in range(n_layers)]
    names = [n for n in resolve_metrics(None) if n in HEAD_METRICS]
    never = property(lambda p: torch.zeros(p.n, dtype=torch.bool))  # no detection: every head stays float32

    def run() -> tuple[float, int]:
        t0, redone = time.perf_counter(), 0
        for layer in layers:
            _, _, num = measure_products(HeadProducts(layer), names)
            redone += int(num.recomputed.sum())
        return time.perf_counter() - t0, redone

    run()  # warm-up: thread pools, MKL's per-thread set-up
    best_on = best_off = float("inf")
    redone = 0
    for _ in range(repeats):
        t, redone = run()
        best_on = min(best_on, t)
        with mock.patch.object(HeadProducts, "unresolved", never):
            best_off = min(best_off, run()[0])
    return best_on, best_off, redone


RATIO_TARGET = 1.25  # (b) / ((e) + max((a'), (d_best))), cold
RSS_TARGETS = {"llama-7b": 1.5, "llama-70b-attn": 2.5}  # peak RSS of `analyze`, GiB, per shape


def shape_of(cfg: dict) -> str | None:
    """The bench/make_checkpoints.py shape whose layers, width and heads the checkpoint's config has, if any."""
    from bench.make_checkpoints import SHAPES

    key = (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"])
    return next((name for name, s in SHAPES.items() if (s.layers, s.d_model, s.heads, s.kv_heads) == key), None)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def main() -> None:
    if "--detection" in sys.argv:
        ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        ap.add_argument("--detection", required=True, help="shape name in bench/make_checkpoints.py")
        ap.add_argument("--layers", type=int, default=4)
        ap.add_argument("--repeats", type=int, default=5)
        a = ap.parse_args()
        on, off, redone = detection_cost(a.detection, a.layers, a.repeats)
        print(f"(f) default metrics, {a.layers} layers of {a.detection} (in memory, torch threads "
              f"{torch.get_num_threads()}): with detection {on:.3f} s, without {off:.3f} s, "
              f"ratio {on / off:.3f} ({(on / off - 1) * 100:+.1f} %); heads recomputed in float64: {redone}")
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--naive-heads", type=int, default=2, help="heads to time on the dense route")
    ap.add_argument("--no-naive", action="store_true", help="skip (c), e.g. for the 70B shape")
    ap.add_argument("--analyze-args", default="", help="extra arguments for qkinspect analyze")
    a = ap.parse_args()
    folder: Path = a.folder
    cfg = json.loads((folder / "config.json").read_text())
    n_heads = cfg["num_hidden_layers"] * cfg["num_attention_heads"]
    extra = a.analyze_args.split()
    print(f"checkpoint: {folder} ({cfg['num_hidden_layers']} layers x {cfg['num_attention_heads']} heads, "
          f"d_model {cfg['hidden_size']}, {cfg['num_key_value_heads']} KV heads); torch threads "
          f"{torch.get_num_threads()}, {os.cpu_count()} CPUs")

    rows = {}
    for cache in ("cold", "warm"):
        (evict if cache == "cold" else warm)(folder)
        floor, qkv, nbytes = read_floor(folder)
        (evict if cache == "cold" else warm)(folder)
        load = os.getloadavg()[0]
        wall, cpu, rss = run_analyze(folder, extra)
        rows[cache] = (floor, qkv, wall, rss)
        print(f"[{cache}] (a) read floor {floor:7.2f} s ({nbytes / 2**30:.2f} GiB, {nbytes / 2**30 / floor:.2f} GiB/s;"
              f" (a') q/k/v {qkv:.2f} s) | (b) analyze {wall:7.2f} s, peak RSS {rss:.2f} GiB | (b)/(a) = "
              f"{wall / floor:.2f} | (b) CPU {cpu:.1f} s, load before {load:.1f}")

    shape = shape_of(cfg)
    limit = RSS_TARGETS.get(shape)
    if limit is not None:
        rss = max(r[3] for r in rows.values())
        print(f"target: peak RSS <= {limit} GiB on the {shape} shape: {rss:.2f} GiB: {verdict(rss <= limit)}")

    if not extra:  # the floor counts the default metrics' products; another selection needs others
        warm(folder)
        schedules = {"one layer at a time": 1}
        side = layers_at_once(cfg)
        if side > 1:
            schedules[f"{side} layers side by side"] = side
        floors = {f"{route} route, {how}": gemm_floor(folder, route, dtype, at_once)
                  for route, dtype in product_routes().items() for how, at_once in schedules.items()}
        best = min(floors, key=floors.get)
        gemm, start = floors[best], startup_floor()
        others = "" if len(product_routes()) > 1 else " (no other exact product route on this machine)"
        print("(d) compute floor of the default metrics, batched products alone: "
              + ", ".join(f"{r} {t:.2f} s" for r, t in floors.items())
              + f"{others}; (d_best) = {gemm:.2f} s ({best}); (e) start-up floor {start:.2f} s"
              " (import torch and the loader)")
        for cache, (floor, qkv, wall, _rss) in rows.items():
            bound = start + max(qkv, gemm)
            judged = f"target <= {RATIO_TARGET}: {verdict(wall / bound <= RATIO_TARGET)}" if cache == "cold" else \
                "(not judged warm)"
            print(f"[{cache}] bound (e) + max((a'), (d_best)) = {bound:.2f} s; (b)/bound = {wall / bound:.2f} "
                  f"{judged}; (b)/(a) = {wall / floor:.2f}; ((d_best) + (e))/(a) = {(gemm + start) / floor:.2f}")

    if not a.no_naive:
        per_head = naive_per_head(folder, a.naive_heads)
        naive = per_head * n_heads
        print(f"(c) naive dense route: {per_head:.2f} s/head x {n_heads} heads = {naive:.0f} s "
              f"({naive / 3600:.2f} h), measured on {a.naive_heads} heads")
        for cache, (_floor, _qkv, wall, _rss) in rows.items():
            print(f"[{cache}] (c)/(b) = {naive / wall:.0f}")


if __name__ == "__main__":
    main()
