"""Benchmark twin training (`qkinspect twin`): each twin's optimizer step against a plain transformers training
step of the same model, and the cost of tracking each head's metrics, measured in one run.

Prints, at nanoGPT's CPU scale by default (llama, 4 layers, d_model 128, 4 heads, context 64, batch 12, a
character-sized vocabulary of 85), one torch thread:
  (a) per variant, its step as `qkinspect twin` runs it (`qkinspect.twin.train.train_step`: forward and backward
      with the constraint's form computed once, the AdamW update) beside a plain step (the standard model, torch's
      AdamW, the same loss) on the same batch, alternating, so that a shared machine's load falls on both: the
      ratio of the medians (targets: standard <= 1.1, each constraint <= 1.3);
  (b) tracking: the seconds of one measurement of every head (qkinspect.callback.Tracker, symmetry and Q/K overlap)
      over 100 of the standard twin's steps: the share of training that `--track-every 100` adds (target <= 5 %).

  (c) with --stacking STEPS: 3 variants (standard, share_qk, symmetric) x 3 seeds of a 2 x 64 llama twin (2 heads,
      context 64, batch 12, characters of the demo text, float32), trained through `qkinspect.twin` one way after
      another in this run: stacked (the default on the CPU: one stack of 9 in this process) against `--stack 1
      --workers 2` (one run a task on a local cluster of 2): the issue's target, wall time; then two stacks on a
      local cluster of 2 (`--workers 2`) and the 9 runs one after another here (`--stack 1 --workers 0`); with
      --stacking-options compile,bf16,threads1 also the default stack compiled, under bfloat16 autocast, or on 1
      torch thread (the default stack uses one thread per core; the ways on workers or one run a task, one a task).
      Each way's wall time, a run's median step, and how far its held-out losses lie from the
      runs' one at a time in this process (the largest difference, nats) (docs/twin.md, "Stacked training").

Usage:
  python bench/twin.py [--arch llama|gpt2] [--layers 4] [--d-model 128] [--heads 4] [--context 64] [--batch 12]
                       [--variants standard,share_qk,...] [--rounds 12] [--json FILE] [--stacking STEPS]
                       [--stacking-options compile,bf16,threads1] [--target]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

VARIANTS = "standard,share_qk,share_qk_reformer,symmetric,share_qkv,rank:8,wq_identity,bilinear"


def plain_step(model, opt, x) -> float:
    logits = model(input_ids=x[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def stacking(steps: int, options: list[str], target: bool = False) -> dict:
    """(c): wall seconds of the same 9 runs trained stacked and one a task, on 2 workers and in this process
    (`target`: on 2 workers only, and in this process one run after another for the records' reference)."""
    import statistics as stats

    from qkinspect.twin.run import twin

    kw = dict(variants="share_qk,symmetric", seeds=3, layers=2, d_model=64, heads=2, context=64, batch=12,
              steps=steps, eval_windows=64)  # threads: each way's default (the default stack: one per core)
    arms = {"stacked": {}, "stack 1, workers 2": {"stack": 1, "workers": 2},
            "stacked, workers 2": {"workers": 2}, "stack 1, workers 0": {"stack": 1, "workers": 0}}
    extra = {"compile": {"compile": True}, "bf16": {"precision": "bf16"}, "threads1": {"threads": 1}}
    arms.update({f"stacked, {o}": extra[o] for o in options})
    if target:
        arms = {k: v for k, v in arms.items() if k in ("stacked", "stack 1, workers 2", "stack 1, workers 0")}
    out, losses, compiled = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{tmp}/inductor"  # compile from cold, as a first run does
        for n, (name, extra_kw) in enumerate(arms.items()):
            t0 = time.perf_counter()
            result = twin(f"{tmp}/{n}", **{**kw, **extra_kw})
            wall = time.perf_counter() - t0
            losses[name] = {(p.variant, p.seed, p.step): p.val_loss for p in result.points}
            docs = [json.loads(f.read_text())["run"] for f in Path(f"{tmp}/{n}/runs").iterdir()]
            compiled[name] = sorted({bool(d.get("stack", {}).get("compile")) for d in docs})
            out[name] = {"wall": wall, "step": stats.median(r.step_seconds for r in result.runs),
                         "runs": len(result.runs)}
    ref = losses["stack 1, workers 0"]
    for name, o in out.items():
        o["max_val_diff"] = max(abs(losses[name][k] - ref[k]) for k in ref)
        print(f"  {name:27s} {o['wall']:6.1f} s wall, a run's median step {o['step'] * 1e3:6.1f} ms, "
              f"held-out losses within {o['max_val_diff']:.1e} nats")
    base = out["stack 1, workers 2"]
    print(f"  stacked: {base['wall'] / out['stacked']['wall']:.2f}x faster in wall time than --stack 1 --workers 2 "
          "(target 1.5x)")
    here = out["stack 1, workers 0"]["wall"]
    print(f"  compiled: {', '.join(f'{k}: {v}' for k, v in compiled.items())}")
    for name in out:
        if name.startswith("stacked"):
            print(f"  {name}: {here / out[name]['wall']:.2f}x faster than --stack 1 --workers 0")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="llama")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=85)
    ap.add_argument("--variants", default=VARIANTS)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--json", default=None)
    ap.add_argument("--stacking", type=int, default=None, metavar="STEPS",
                    help="(c) only: stacked against one run a task, STEPS steps a run")
    ap.add_argument("--target", action="store_true",
                    help="(c): only the issue's target (stacked against --stack 1 --workers 2) and the reference")
    ap.add_argument("--stacking-options", default="", metavar="LIST",
                    help="(c): also a stack of 9 in this process with each of compile, bf16, threads1")
    args = ap.parse_args()
    torch.set_num_threads(1)

    if args.stacking is not None:
        options = [o for o in args.stacking_options.split(",") if o]
        bad = sorted(set(options) - {"compile", "bf16", "threads1"})
        if bad:
            ap.error(f"--stacking-options: {','.join(bad)} is not one of compile, bf16, threads1")
        print(f"3 variants x 3 seeds of a 2 x 64 llama twin, {args.stacking} steps (threads: each way's default):")
        out = {"stacking": stacking(args.stacking, options, args.target)}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        return

    from qkinspect.callback import Tracker
    from qkinspect.experiment.heal import adamw
    from qkinspect.twin.model import build, config_for, standard_model
    from qkinspect.twin.request import Shape
    from qkinspect.twin.train import train_step

    shape = Shape(args.arch, args.layers, args.d_model, args.heads, args.context)
    x = torch.randint(0, args.vocab, (args.batch, args.context + 1), generator=torch.Generator().manual_seed(0))
    plain = standard_model(config_for(shape, args.vocab), seed=0)
    plain_opt = adamw(list(plain.parameters()), 1e-3)
    out = {"shape": vars(args), "variants": {}}
    print(f"{args.arch} {args.layers}x{args.d_model}, {args.heads} heads, context {args.context}, batch "
          f"{args.batch}; one thread; median of {args.rounds - 2} alternating steps")
    for variant in args.variants.split(","):
        built = build(variant, shape, args.vocab, seed=0)
        opt = adamw(built.trained, 1e-3)
        mine, base = [], []
        for _ in range(args.rounds):
            base.append(timed(lambda: plain_step(plain, plain_opt, x)))
            mine.append(timed(lambda: train_step(built, opt, x)))  # noqa: B023 - called at once
        m, b = statistics.median(mine[2:]), statistics.median(base[2:])
        out["variants"][variant] = {"step": m, "plain_step": b, "ratio": m / b, "params": built.params}
        print(f"  {variant:18s} step {m * 1e3:7.1f} ms  plain {b * 1e3:7.1f} ms  ratio {m / b:5.2f}")
    built = build("standard", shape, args.vocab, seed=0)
    opt = adamw(built.trained, 1e-3)
    with tempfile.TemporaryDirectory() as tmp:
        tracker = Tracker(tmp, name="bench")
        measures, steps = [], []
        for k in range(5):
            steps += [timed(lambda: train_step(built, opt, x)) for _ in range(4)]  # noqa: B023
            measures.append(timed(lambda: tracker.measure(built.model, k)))  # noqa: B023
    share = statistics.median(measures) / (100 * statistics.median(steps))
    out["tracking"] = {"measure": statistics.median(measures), "step": statistics.median(steps),
                       "share_at_100": share}
    print(f"  tracking: one measurement {statistics.median(measures) * 1e3:.1f} ms = {share:.1%} of 100 steps")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
