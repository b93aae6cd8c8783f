"""Fuzzing the checkpoint's description: config.json, the shard index, the safetensors headers and the GGUF
metadata of a tiny model are mutated (hypothesis), and every mutation must end in one of two ways:

- exit 0 with a valid JSON document, written (atomically) where -o says, or
- exit 2 with exactly one ``error:`` line on stderr, nothing on stdout, no traceback, and nothing written;

each in bounded time and memory. Examples are derandomized (the suite is repeatable) and bounded so the whole file
runs in well under a minute; QKINSPECT_FUZZ_EXAMPLES=500 runs a longer hunt. Most run the CLI in-process for speed;
a few go through the real executable for the real exit path.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from qkinspect.cli.app import app
from tests.loading import tiny

EXAMPLES = int(os.environ.get("QKINSPECT_FUZZ_EXAMPLES", "12"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
SECONDS = 60.0  # per run; a tiny model analyses in well under a second (imports are warmed up in `base`)
GROWTH = 1 << 30  # peak resident memory may grow by at most this much over the whole fuzz run

INDEX = "model.safetensors.index.json"
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A sharded tiny Llama (config.json, index, two safetensors shards) and its GGUF, side by side."""
    root = tmp_path_factory.mktemp("fuzz_base")
    config, state = tiny.llama()
    tiny.write(root / "model", config, state, shards=2)
    tiny.llama_gguf_with(root / "m.gguf", state)
    torch.save(state, root / "state.pt")  # the GGUF fuzz rewrites the file from these weights
    for spec in (root / "model", root / "m.gguf"):  # import what the runs use (seconds on a busy machine) once
        r = CliRunner().invoke(app, ["analyze", str(spec), "--metrics", "symmetry", "--format", "json"])
        assert r.exit_code == 0, r.stderr
    return root


# -- what a run must do --------------------------------------------------------------------------------------


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file and link under `folder` (size, mtime): what a run may not write or touch."""
    return {str(p.relative_to(folder)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in folder.rglob("*")
            if not p.is_dir() or p.is_symlink()}


def peak_rss() -> int:
    """The process's peak resident memory since the last `reset_peak_rss` (Linux's VmHWM), else since it started."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> int:
    """Start a new peak (writing 5 to /proc/self/clear_refs, Linux >= 4.0), so that the tests run before this
    module (which may have loaded whole models) do not count; returns the peak it starts from."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    return peak_rss()


def check_run(spec: Path, work: Path, to_file: bool) -> None:
    """Run `analyze` on `spec` in-process and check the outcome (see the module's docstring)."""
    out = work / "out" / "result.json"
    out.parent.mkdir(exist_ok=True)
    args = ["analyze", str(spec), "--metrics", "symmetry", "--format", "json"] + (["-o", str(out)] if to_file else [])
    before = snapshot(work)
    start_rss = reset_peak_rss()
    t0 = time.perf_counter()
    r = CliRunner().invoke(app, args)
    elapsed = time.perf_counter() - t0
    check_outcome(r.exit_code, r.stdout, r.stderr, out if to_file else None, work, before)
    assert elapsed < SECONDS, f"took {elapsed:.1f} s"
    assert peak_rss() - start_rss < GROWTH, f"peak memory grew by {(peak_rss() - start_rss) >> 20} MiB"


def check_outcome(code: int, stdout: str, stderr: str, out: Path | None, work: Path, before: dict) -> None:
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    if code == 0:
        doc = json.loads(out.read_text() if out is not None else stdout)
        assert doc["schema"] == "qkinspect/1" and doc["heads"], "exit 0 without results"
        after = snapshot(work)
        written = {k for k in after if k not in before or after[k] != before[k]}
        assert written <= ({"out/result.json"} if out is not None else set()), written
    else:
        assert code == 2, (code, stderr)
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), stderr
        assert stdout == ""
        assert snapshot(work) == before  # nothing written: no output file, no temporary file, model untouched


# -- mutations -------------------------------------------------------------------------------------------------

json_scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.sampled_from([0, -1, 1, 3, 7, 2**40])
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
                | st.sampled_from(["bert", "llama", "../x", "/etc/passwd", "", "model-00001-of-00002.safetensors"]))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
deep = st.integers(50, 5000).map(lambda n: json.loads("[" * min(n, 500) + "]" * min(n, 500)))


@st.composite
def json_edit(draw, keys: list[str]):
    """(key, value) to set in a JSON object, value None meaning: delete the key."""
    key = draw(st.sampled_from(keys) | st.text(min_size=1, max_size=8))
    value = draw(json_values | deep | st.just("<delete>"))
    return key, value


def apply_json(path: Path, edits: list[tuple[str, object]], sub: str | None = None) -> None:
    data = json.loads(path.read_text())
    target = data if sub is None else data.setdefault(sub, {})
    for key, value in edits:
        if value == "<delete>":
            target.pop(key, None)
        else:
            target[key] = value
    path.write_text(json.dumps(data, allow_nan=True))


@st.composite
def byte_edits(draw, size: int, upto: int | None = None):
    """A few byte flips, insertions or a truncation within the first `upto` bytes of a `size`-byte file."""
    upto = min(size, upto or size)
    ops = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["set", "insert", "truncate"]))
        ops.append((kind, draw(st.integers(0, upto - 1)), draw(st.integers(0, 255))))
    return ops


def apply_bytes(path: Path, ops) -> None:
    data = bytearray(path.read_bytes())
    for kind, at, value in ops:
        at = min(at, max(len(data) - 1, 0))
        if kind == "set" and data:
            data[at] = value
        elif kind == "insert":
            data[at:at] = bytes([value])
        elif kind == "truncate":
            del data[at:]
    path.write_bytes(bytes(data))


def copy_of(base: Path, work: Path) -> Path:
    shutil.copytree(base / "model", work / "model")
    shutil.copy(base / "m.gguf", work / "m.gguf")
    return work / "model"


CONFIG_KEYS = ["model_type", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
               "num_hidden_layers", "rope_parameters", "rope_theta", "rms_norm_eps", "attention_bias",
               "tie_word_embeddings", "torch_dtype", "layer_types", "sliding_window", "quantization_config"]


@FUZZ
@given(edits=st.lists(json_edit(CONFIG_KEYS), min_size=1, max_size=3), sub=st.none() | st.just("text_config"),
       to_file=st.booleans())
def test_fuzz_config_json(base, edits, sub, to_file):
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        model = copy_of(base, work)
        apply_json(model / "config.json", edits, sub)
        check_run(model, work, to_file)


@FUZZ
@given(ops=byte_edits(643), to_file=st.booleans())
def test_fuzz_config_bytes(base, ops, to_file):
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        model = copy_of(base, work)
        apply_bytes(model / "config.json", ops)
        check_run(model, work, to_file)


shard_names = (st.sampled_from([*SHARDS, "../model/" + SHARDS[0], "../m.gguf", "/etc/passwd", "", ".", "..",
                                "config.json", "model", INDEX, "missing.safetensors", "a/../" + SHARDS[1]])
               | json_values)


@FUZZ
@given(changes=st.lists(st.tuples(st.integers(0, 200), shard_names), min_size=1, max_size=3),
       whole=st.none() | json_values, to_file=st.booleans())
def test_fuzz_shard_index(base, changes, whole, to_file):
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        model = copy_of(base, work)
        index = json.loads((model / INDEX).read_text())
        names = sorted(index["weight_map"])
        for k, value in changes:
            index["weight_map"][names[k % len(names)]] = value
        if whole is not None:
            index["weight_map"] = whole
        (model / INDEX).write_text(json.dumps(index, allow_nan=True))
        check_run(model, work, to_file)


def read_header(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def write_header(path: Path, header: dict, rest: bytes, length: int | None = None) -> None:
    raw = json.dumps(header, allow_nan=True).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + rest)


tensor_fields = st.sampled_from(["dtype", "shape", "data_offsets"])
field_values = (st.sampled_from(["F32", "F16", "BF16", "I32", "I8", "U8", "BOOL", "F64", "F8_E4M3", "Q4", ""])
                | st.lists(st.integers(-2, 2**40) | st.sampled_from([0, 1, 4, 16, 64]), max_size=4)
                | json_values)


@FUZZ
@given(shard=st.sampled_from(SHARDS), which=st.integers(0, 100), field=tensor_fields, value=field_values,
       length=st.none() | st.integers(0, 2**64 - 1), ops=st.none() | byte_edits(4096, 300), to_file=st.booleans())
def test_fuzz_safetensors_header(base, shard, which, field, value, length, ops, to_file):
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        model = copy_of(base, work)
        header, rest = read_header(model / shard)
        names = sorted(k for k in header if k != "__metadata__")
        header[names[which % len(names)]][field] = value
        write_header(model / shard, header, rest, length)
        if ops is not None:
            apply_bytes(model / shard, ops)
        check_run(model, work, to_file)


gguf_keys = st.sampled_from(["block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
                             "attention.key_length", "rope.dimension_count", "rope.freq_base", "context_length",
                             "feed_forward_length", "attention.layer_norm_rms_epsilon", "vocab_size"])
gguf_values = (st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.sampled_from([0, 1, 2, 3, 4, 16, 64])
               | st.floats(width=32, allow_nan=True) | st.text(max_size=8)
               | st.lists(st.integers(-5, 70), min_size=1, max_size=4))


@FUZZ
@given(meta=st.dictionaries(gguf_keys, gguf_values, min_size=1, max_size=3), to_file=st.booleans())
def test_fuzz_gguf_metadata(base, meta, to_file):
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        path = tiny.llama_gguf_with(work / "m.gguf", torch.load(base / "state.pt"), **meta)
        check_run(path, work, to_file)


@FUZZ
@given(ops=byte_edits(1 << 20, 1200), to_file=st.booleans())
def test_fuzz_gguf_header_bytes(base, ops, to_file):
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        copy_of(base, work)
        apply_bytes(work / "m.gguf", ops)
        check_run(work / "m.gguf", work, to_file)


# -- the real executable: exit codes and streams as a shell sees them -----------------------------------------


REAL_CASES = {
    "zero-heads": lambda m: apply_json(m / "config.json", [("num_attention_heads", 0)]),
    "deep-json": lambda m: (m / "config.json").write_text('{"model_type": "llama", "x": ' + "[" * 100_000
                                                          + "]" * 100_000 + "}"),
    "index-escapes": lambda m: apply_json(m / INDEX, [("weight_map", {"model.layers.0.self_attn.q_proj.weight":
                                                                      "../../../../../../etc/passwd"})]),
}


def test_real_executable_refuses_with_one_line(base, tmp_path):
    """A few mutations through the real executable (started together: each pays Python's and torch's start-up):
    exit status 2, one line, nothing written, peak memory of each process bounded."""
    runs = {}
    for name, mutate in REAL_CASES.items():
        work = tmp_path / name
        model = copy_of(base, work)
        mutate(model)
        p = subprocess.Popen([sys.executable, "-m", "qkinspect", "analyze", str(model), "-o", "out.json"],
                             cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
        runs[name] = (p, work, snapshot(work))
    for name, (p, work, before) in runs.items():
        out, err = p.communicate(timeout=300)
        check_outcome(p.returncode, out, err, None, work, before)
        assert p.returncode == 2, name
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 < 4 << 30  # the largest child's peak
