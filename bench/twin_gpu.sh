#!/usr/bin/env bash
# The twin at the GPU scale of docs/twin.md (6 layers x 384, 6 heads, context 256) for a few steps on cuda: that it
# runs, its step time per variant, and the peak memory. Usage: bash bench/twin_gpu.sh [STEPS]
set -u
steps=${1:-60}
python -c "import torch, transformers, tokenizers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))" || exit 1
out=${OUT:-/tmp}/twin-gpu
python -m qkinspect twin --out "$out" --device cuda --layers 6 --d-model 384 --heads 6 --context 256 --batch 32 \
  --steps "$steps" --warmup 10 --eval-every 30 --seeds 1 --variants share_qk,symmetric,share_qk_reformer,bilinear \
  --workers 0 -f table
python - "$out" <<'PY'
import json, glob, sys
for f in sorted(glob.glob(sys.argv[1] + "/runs/*.json")):
    r = json.load(open(f))["run"]
    print(f"{r['variant']:20s} step {r['step_seconds'] * 1e3:7.1f} ms  params {r['params']:,}  loss {r['points'][-1]['val_loss']:.4f}")
PY
