"""Commands that need no tensor math start without torch: `--help`, `--version`, `info` on every format, and the
errors found before any work (docs/performance.md, "Start-up").

Each command runs in a fresh interpreter (the installed entry point's `main`, through `python -m qkinspect`), which
then reports which heavy packages its run imported. A top-level `import torch` (or transformers, or numpy) added to
any module these commands import makes a case here fail. One case runs `analyze`, which must import torch: it shows
that the probe sees the import when there is one.
"""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.loading import tiny

ROOT = Path(__file__).parents[1]
HEAVY = ("torch", "transformers", "numpy", "matplotlib", "scipy", "pandas", "safetensors")
# Runs the CLI as `python -m qkinspect ARGS` does, then writes the heavy packages it imported to $QK_PROBE_OUT.
PROBE = textwrap.dedent("""
    import json, os, runpy, sys
    sys.argv = ["qkinspect", *sys.argv[1:]]
    code = 0
    try:
        runpy.run_module("qkinspect", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code
    finally:
        with open(os.environ["QK_PROBE_OUT"], "w") as f:
            json.dump(sorted(m for m in sys.modules if m in os.environ["QK_PROBE_HEAVY"].split(",")), f)
    sys.exit(code)
""")
COMMANDS = sorted(m.name for m in pkgutil.iter_modules([str(ROOT / "qkinspect" / "cli" / "commands")]))


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """Every layout `info` opens: a safetensors folder, a sharded one, a single file, .bin (single and sharded),
    GGUF, a hub-cache snapshot; and folders that are refused before any tensor is read."""
    root = tmp_path_factory.mktemp("startup")
    config, state = tiny.llama()
    out = {"folder": tiny.write(root / "llama", config, state),
           "sharded": tiny.write(root / "sharded", config, state, shards=2),
           "gguf": tiny.llama_gguf_with(root / "llama.gguf", state)}
    out["file"] = out["folder"] / "model.safetensors"
    out["bin"] = tiny.write(root / "bin", config, state, fmt="bin")
    out["bin_sharded"] = tiny.write(root / "bin_sharded", config, state, fmt="bin", shards=2)
    out["bert"] = tiny.write(root / "bert", *tiny.bert())
    snapshot = root / "cache" / "models--org--name" / "snapshots" / ("0123abcd" * 5)
    tiny.write(snapshot, config, state)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0123abcd" * 5)  # a 40-hex commit
    out["cache"] = root / "cache"
    for name, edit in {"unknown_arch": lambda c: c.update(model_type="no-such-arch"),
                       "zero_heads": lambda c: c.update(num_attention_heads=0)}.items():
        folder = tiny.write(root / name, config, state)
        cfg = json.loads((folder / "config.json").read_text())
        edit(cfg)
        (folder / "config.json").write_text(json.dumps(cfg))
        out[name] = folder
    escapes = tiny.write(root / "escapes", config, state, shards=2)
    index = escapes / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    doc["weight_map"]["layers.0.self_attn.q_proj.weight"] = "../../../../etc/passwd"
    index.write_text(json.dumps(doc))
    out["escapes"] = escapes
    out["work"] = root / "work"
    out["work"].mkdir()
    return out


def _cases(m: dict[str, Path]) -> dict[str, tuple[list[str], int, str]]:
    """name -> (arguments, exit code, text the output must hold)."""
    w = m["work"]
    cases = {
        "--help": (["--help"], 0, "Usage"),
        "--version": (["--version"], 0, "qkinspect "),
        **{f"{c} --help": ([c, "--help"], 0, "Example") for c in COMMANDS},
        "info demo": (["info"], 0, "all-MiniLM-L6-v2"),
        "info demo json": (["info", "--format", "json"], 0, '"attention_bytes"'),
        "info folder": (["info", str(m["folder"])], 0, "llama"),
        "info sharded": (["info", str(m["sharded"])], 0, "llama"),
        "info file": (["info", str(m["file"])], 0, "llama"),
        "info gguf": (["info", str(m["gguf"])], 0, "gguf"),
        "info bin": (["info", str(m["bin"])], 0, '"format": "bin"'),
        "info bin sharded": (["info", str(m["bin_sharded"])], 0, '"format": "bin"'),
        "info hub cache": (["info", "org/name"], 0, "org/name"),
        "missing path": (["info", str(w / "nothing")], 2, "no such file or folder"),
        "bad --layers": (["analyze", "--layers", "x"], 2, "--layers"),
        "--layers out of range": (["analyze", str(m["folder"]), "--layers", "9"], 2, "out of range"),
        "unknown block": (["analyze", str(m["folder"]), "--block", "nope"], 2, "--block nope"),
        "unknown metric": (["analyze", "--metrics", "nope"], 2, "unknown metric"),
        "unknown architecture": (["info", str(m["unknown_arch"])], 2, "no-such-arch"),
        "hostile config": (["analyze", str(m["zero_heads"])], 2, "num_attention_heads"),
        "hostile index": (["analyze", str(m["escapes"])], 2, "outside the model folder"),
        "spectrum out of range": (["spectrum", str(m["folder"]), "--layer", "9", "--head", "0"], 2, "--layer"),
        "extract out of range": (["extract", str(m["folder"]), "--layers", "9", "-o", str(w / "x.safetensors")],
                                 2, "out of range"),
        "plot out of range": (["plot", str(m["folder"]), "--layers", "9", "-o", str(w / "x.png")], 2, "out of range"),
        "report out of range": (["report", str(m["folder"]), "--layers", "9", "-o", str(w / "x.pdf")], 2,
                                "out of range"),
        "compare missing": (["compare", str(w / "a"), str(w / "b")], 2, "no such file or folder"),
        "compare other shapes": (["compare", str(m["folder"]), str(m["bert"])], 2, "cannot compare"),
        "experiment unknown edit": (["experiment", "--edit", "share_kq"], 2, "unknown edit 'share_kq'"),
        "experiment bad --layers": (["experiment", "--edit", "rank:4", "--layers", "1-x"], 2, "--layers"),
    }
    return cases


# the heavy packages each case may import: GGUF files are read with the gguf package, which imports numpy
ALLOWED = {"info gguf": {"numpy"}}
CONTROL = "control: analyze"


@pytest.fixture(scope="module")
def runs(models, tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, list[str]]]:
    """Every case in its own interpreter, started together (two cores: each pays Python's start-up)."""
    out_dir = tmp_path_factory.mktemp("probe")
    cases = _cases(models)
    cases[CONTROL] = (["analyze", str(models["folder"]), "--layers", "0", "--metrics", "symmetry"], 0, "symmetry")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_CACHE": str(models["cache"]), "HF_HUB_OFFLINE": "1",
           "COLUMNS": "120", "QK_PROBE_HEAVY": ",".join(HEAVY)}
    procs = {}
    for k, (name, (args, _, _)) in enumerate(cases.items()):
        probe_out = out_dir / f"{k}.json"
        p = subprocess.Popen([sys.executable, "-c", PROBE, *args], cwd=models["work"], text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env={**env, "QK_PROBE_OUT": str(probe_out)})
        procs[name] = (p, probe_out)
    results = {}
    for name, (p, probe_out) in procs.items():
        stdout, stderr = p.communicate(timeout=600)
        done = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
        results[name] = (done, json.loads(probe_out.read_text()) if probe_out.exists() else None)
    return {name: (results[name], cases[name]) for name in cases}


CASE_NAMES = list(_cases({k: Path(k) for k in ("folder", "sharded", "gguf", "file", "bin", "bin_sharded", "bert",
                                                "unknown_arch", "zero_heads", "escapes", "work")}))


@pytest.mark.parametrize("name", CASE_NAMES)
def test_command_starts_without_torch(runs, name):
    (done, imported), (_, code, text) = runs[name]
    assert imported is not None, done.stderr
    assert done.returncode == code, done.stderr
    assert text in done.stdout + done.stderr, (done.stdout, done.stderr)
    if code == 2:  # one line, the error, nothing on stdout
        assert done.stdout == "" and done.stderr.strip().splitlines()[-1].startswith("error: "), done.stderr
        assert "Traceback" not in done.stderr
    assert "torch" not in imported and "transformers" not in imported, imported
    assert set(imported) <= ALLOWED.get(name, set()), f"{name} imported {imported}"


def test_the_probe_sees_torch_when_a_command_needs_it(runs):
    (done, imported), (_, code, text) = runs[CONTROL]
    assert done.returncode == code and text in done.stdout, done.stderr
    assert "torch" in imported and "numpy" in imported


def test_library_import_stays_light():
    """`import qkinspect` and its loader's names, as the library API exposes them, import no torch."""
    code = ("import sys, qkinspect; from qkinspect.loading import open_model, load, LoadedModel; "
            "from qkinspect.loading.source import SafetensorsSource, DictSource; "
            "assert callable(qkinspect.load) and 'analyze' in dir(qkinspect); "
            f"print(sorted(m for m in sys.modules if m in {HEAVY!r}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    imported = done.stdout.strip()
    assert "torch" not in imported and "numpy" not in imported, imported
