#!/usr/bin/env bash
# ONE prepared GPU protocol for the twin (docs/twin.md, "Stacked training" and "Scale"), sized for one 15-minute
# window on one GPU (an H200 lent by chance): stacked runs, bfloat16 autocast with float32 weights, fused AdamW.
#
#   1. the 4 x 128 protocol (nanoGPT's CPU scale: context 64, batch 12, characters): standard + 4 constraints x 3
#      seeds = 15 runs in one stack; its aggregate tokens/s against 10x docs/twin.md's H200 figure (about 23k
#      tokens/s a run, 12 at a time: 276k aggregate, so the target is 2.76M);
#   2. the ladder --shapes 2x64,4x128,6x192 (head size 32), standard, share_qk, symmetric, share_kv x 3 seeds;
#   3. 6 x 384 (6 heads, context 256, batch 32): standard and share_qk x 3 seeds in one stack; tokens/s per run
#      against 300k.
# Each stage has its own time limit, so one that overruns cannot eat the window; the figures are printed at the end
# (tokens/s from each run's record: batch x context / step_seconds, the stack's training steps only).
#
# The GPU image has torch, transformers, tokenizers, numpy, safetensors but not dask/distributed, pydantic or gguf.
# `--workers 0` needs no Dask; gguf is imported only to read GGUF files. The script checks what the CLI imports and
# names the wheels to carry where any is missing: on this machine, `pip download --no-deps -d wheels/ <names>` and,
# there, `pip install --no-deps wheels/*.whl`, then `pip install --no-deps -e .` (or PYTHONPATH=$PWD).
#
# Usage: bash bench/twin_gpu.sh [TEXT]   (TEXT: a file or folder of .txt; default the demo text). Output: $OUT or /tmp.
# TWIN_GPU_DRY=1 runs every stage on the CPU in float32 at tiny sizes (a check of the script and the CLI, no GPU).
set -u
text=${1:-}
out=${OUT:-/tmp}/twin-gpu
dry=${TWIN_GPU_DRY:-}
DRY=$dry python - <<'PY' || exit 1
import os
import importlib.util, sys
need = ["torch", "transformers", "tokenizers", "numpy", "safetensors", "scipy", "typer", "rich", "matplotlib",
        "huggingface_hub"]
missing = [m for m in need if importlib.util.find_spec(m) is None]
if missing:
    print("carry these wheels (pip download --no-deps -d wheels/ " + " ".join(missing) + "), then pip install "
          "--no-deps wheels/*.whl", file=sys.stderr)
    sys.exit(1)
import torch, transformers
if not torch.cuda.is_available() and not os.environ.get("DRY"):
    print("no CUDA device", file=sys.stderr)
    sys.exit(1)
print("torch", torch.__version__, "transformers", transformers.__version__,
      *((torch.cuda.get_device_name(0), "bf16" if torch.cuda.is_bf16_supported() else "no bf16")
        if torch.cuda.is_available() else ("dry run on the CPU",)))
PY
common=(--device cuda --precision bf16 --workers 0 --tokenizer char -f json)
[ -n "$text" ] && common+=(--text "$text")
tiny=()  # TWIN_GPU_DRY: the CPU, float32, tiny sizes (the last of a repeated option wins)
[ -n "$dry" ] && tiny=(--device cpu --precision float32 --steps 4 --warmup 1 --eval-every 2 --eval-windows 4
  --batch 2 --context 8 --seeds 2)
stage() {  # stage NAME SECONDS ARGS...: one twin command under its own limit
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS sizes=()
  if [ -n "$dry" ]; then
    case $name in ladder) sizes=(--shapes 1x16,2x16 --head-size 8) ;; *) sizes=(--layers 1 --d-model 16 --heads 2) ;; esac
  fi
  timeout "$limit" python -m qkinspect twin --out "$out/$name" "${common[@]}" "$@" ${tiny[@]+"${tiny[@]}"} \
    ${sizes[@]+"${sizes[@]}"} > "$out/$name.json" \
    2> "$out/$name.log" || echo "$name: stopped or failed after $((SECONDS - t0)) s (see $out/$name.log)"
  echo "$name: $((SECONDS - t0)) s"
}
mkdir -p "$out"
stage 4x128 200 --layers 4 --d-model 128 --heads 4 --context 64 --batch 12 --steps 2000 --warmup 100 \
  --eval-every 500 --lr 1e-3 --seeds 3 --variants share_qk,symmetric,share_qkv,share_kv
stage ladder 300 --shapes 2x64,4x128,6x192 --head-size 32 --context 64 --batch 12 --steps 2000 --warmup 100 \
  --eval-every 500 --lr 1e-3 --seeds 3 --variants share_qk,symmetric,share_kv
stage 6x384 240 --layers 6 --d-model 384 --heads 6 --context 256 --batch 32 --steps 600 --warmup 60 \
  --eval-every 300 --lr 1e-3 --seeds 3 --variants share_qk
python - "$out" <<'PY'
import glob, json, os, sys
root = sys.argv[1]
targets = {"4x128": ("aggregate", 10 * 276_000), "6x384": ("per run", 300_000)}
print(f"{'stage':22s} {'runs':>4s} {'stack':>5s} {'tok/s a run':>12s} {'tok/s aggregate':>16s}  target")
for stage in ("4x128", "ladder", "6x384"):
    for folder in sorted({os.path.dirname(os.path.dirname(f)) for f in
                          glob.glob(f"{root}/{stage}/**/runs/*.json", recursive=True)}):
        runs = [json.load(open(f))["run"] for f in glob.glob(f"{folder}/runs/*.json")]
        setup = json.load(open(f"{folder}/twin.json"))["setup"]["training"]
        tokens = setup["batch"] * setup["context"]
        per = [tokens / r["step_seconds"] for r in runs if r.get("step_seconds")]
        if not per:
            continue
        stacks = max(r.get("stack", {}).get("runs", 1) for r in runs)
        a_run = sorted(per)[len(per) // 2]
        aggregate = a_run * stacks
        name = os.path.relpath(folder, root)
        kind, goal = targets.get(stage, (None, None))
        met = "" if goal is None else \
            f"{kind} >= {goal:,}: {'met' if (aggregate if kind == 'aggregate' else a_run) >= goal else 'not met'}"
        print(f"{name:22s} {len(runs):4d} {stacks:5d} {a_run:12,.0f} {aggregate:16,.0f}  {met}")
PY
