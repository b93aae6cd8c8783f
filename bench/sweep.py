"""Benchmark `qkinspect sweep` against running `qkinspect analyze` once per checkpoint, as a ratio.

A random GPT-2-base-sized checkpoint (124M parameters, float32, 12 layers x 12 heads, d_model 768) is built with
transformers and saved once; it is copied 8 times as checkpoint-1000 ... checkpoint-8000 (real copies, so each has
its own pages), and every file is read once so that both routes start from the page cache. Then:

  (a) sequential: 8 x `qkinspect analyze CHECKPOINT -o FILE.json`, one process after the other (what a shell loop
      does); default metrics
  (b) sweep: one `qkinspect sweep 'checkpoint-*' --workers W --out DIR -o table.csv` (a LocalCluster of W worker
      processes, each with cores // W torch threads), into an empty folder
  (c) in-process: 8 x `qkinspect.analyze` in one Python process that has already imported everything (no start-up
      cost at all: the stricter bar)

and prints (b)/(a) and (b)/(c). A ratio <= 1.0 means the engine saves more than it costs.

Usage: python bench/sweep.py [--workers 2] [--copies 8] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def build(folder: Path, copies: int) -> list[Path]:
    import torch
    from transformers import GPT2Config, GPT2Model

    base = folder / "base"
    if not (base / "config.json").exists():
        torch.manual_seed(0)
        model = GPT2Model(GPT2Config()).eval()  # GPT-2 base: 124M parameters
        model.save_pretrained(base, safe_serialization=True)
        del model
    out = []
    for i in range(1, copies + 1):
        dst = folder / f"checkpoint-{1000 * i}"
        if not dst.exists():
            shutil.copytree(base, dst)
        out.append(dst)
    for p in out:  # into the page cache
        for f in p.iterdir():
            with open(f, "rb") as fh:
                while fh.read(1 << 24):
                    pass
    return out


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--keep", type=Path, help="build the checkpoints here and keep them (default: a temp folder)")
    args = ap.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="qk-sweep-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        checkpoints = build(folder, args.copies)
        size = sum(f.stat().st_size for f in checkpoints[0].iterdir()) / 1e6
        qk = [sys.executable, "-m", "qkinspect"]
        print(f"{len(checkpoints)} copies of a GPT-2-base checkpoint ({size:.0f} MB each); "
              f"{len(os.sched_getaffinity(0))} cores; load average {os.getloadavg()[0]:.1f}")

        seq = sum(timed([*qk, "analyze", str(c), "-o", str(folder / f"a{i}.json")]) for i, c in enumerate(checkpoints))
        print(f"(a) {len(checkpoints)} x qkinspect analyze, in sequence: {seq:.1f} s")

        shutil.rmtree(folder / "sweep", ignore_errors=True)
        sweep = timed([*qk, "sweep", str(folder / "checkpoint-*"), "--workers", str(args.workers), "--out",
                       str(folder / "sweep"), "-o", str(folder / "table.csv")])
        print(f"(b) qkinspect sweep --workers {args.workers}: {sweep:.1f} s")

        import qkinspect

        qkinspect.analyze(checkpoints[0], layers=[0])  # imports and first-call set-up outside the timing
        t0 = time.perf_counter()
        for c in checkpoints:
            qkinspect.analyze(c)
        inproc = time.perf_counter() - t0
        print(f"(c) {len(checkpoints)} x qkinspect.analyze in one warm process: {inproc:.1f} s")
        print(f"ratio sweep / sequential analyze runs: {sweep / seq:.2f}")
        print(f"ratio sweep / in-process analyze calls: {sweep / inproc:.2f}")
        print(f"load average after: {os.getloadavg()[0]:.1f}")
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
