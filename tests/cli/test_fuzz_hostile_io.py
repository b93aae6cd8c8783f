"""Fuzzing what qkinspect reads back besides checkpoints (issue 25): an experiment's runs.json, a sweep folder's
result files and manifest, and `--scheduler` addresses and the replies of what listens there. Each mutation is fed
to the commands that read it, and every run must end in one of two ways:

- exit 0 with its output written, or
- exit 2 with exactly one ``error:`` line, nothing on stdout, no traceback, and no output file;

never exit 1, each within 60 s, and peak memory may grow by at most 1 GiB over the whole run (the same promise
and the same machinery as tests/loading/test_fuzz_hostile.py). Library entry points that take the same input
(the experiment section of a report, a resumed sweep's look at its folder, the scheduler probe) may raise only
InputError. Examples are derandomized and few; QKINSPECT_FUZZ_EXAMPLES=500 runs a longer hunt.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from qkinspect.cli.app import app
from qkinspect.errors import InputError
from tests.loading.test_fuzz_hostile import (
    FUZZ,
    GROWTH,
    SECONDS,
    apply_bytes,
    byte_edits,
    deep,
    json_values,
    peak_rss,
    reset_peak_rss,
    snapshot,
)
from tests.report.test_hostile_runs import document
from tests.sweep.test_hostile_scheduler import listener

# -- what a run must do -------------------------------------------------------------------------------------


@contextlib.contextmanager
def bounded():
    start = reset_peak_rss()
    t0 = time.perf_counter()
    yield
    assert time.perf_counter() - t0 < SECONDS, f"took {time.perf_counter() - t0:.1f} s"
    assert peak_rss() - start < GROWTH, f"peak memory grew by {(peak_rss() - start) >> 20} MiB"


def check_cli(args: list, out: Path, work: Path) -> int:
    """Run the CLI in-process; exit 0 with `out` written, or exit 2 with one line and nothing written."""
    before = snapshot(work)
    with bounded():
        r = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    if r.exit_code == 0:
        assert out.is_file() and out.stat().st_size > 0
    else:
        assert r.exit_code == 2, (r.exit_code, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
        assert r.stdout == ""
        assert snapshot(work) == before, "written or touched on failure"
    return r.exit_code


# -- mutating a JSON document at any of its paths ---------------------------------------------------------------


def paths(doc, prefix=()) -> list[tuple]:
    """Every path (tuple of keys and indexes) to a value in `doc`, the root excluded."""
    out = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        out.append((*prefix, k))
        out.extend(paths(v, (*prefix, k)))
    return out


@st.composite
def json_mutations(draw, doc) -> list[tuple[tuple, object]]:
    """A few (path, new value) changes at paths of `doc`; the value "<delete>" removes the key."""
    where = paths(doc)
    return [(where[draw(st.integers(0, len(where) - 1))],
             draw(json_values | deep | st.just("<delete>") | st.sampled_from([1e308, -1e308, 2**70, "rank:³"])))
            for _ in range(draw(st.integers(1, 3)))]


def apply_mutations(doc, changes) -> object:
    for path, value in changes:
        node = doc
        try:
            for k in path[:-1]:
                node = node[k]
            if value == "<delete>":
                del node[path[-1]]
            else:
                node[path[-1]] = value
        except (KeyError, IndexError, TypeError):  # an earlier change removed or replaced the path
            continue
    return doc


# Valid but odd values (what passes the checks must not fail later): numbers at the edges of their range, nulls.
odd_numbers = (st.none() | st.sampled_from([0, 0.0, -0.0, 1, -1, 1e-300, 5e-324]) | st.integers(-10**9, 10**9)
               | st.floats(-1e9, 1e9, allow_nan=False, allow_infinity=False))
odd_metrics = odd_numbers | st.floats(-1e30, 1e30, allow_nan=False, allow_infinity=False)


@st.composite
def value_mutations(draw, doc, leaves: tuple[str, ...], values) -> list[tuple[tuple, object]]:
    """Changes of the numeric leaves named `leaves` (at any depth of `doc`) to `values`."""
    where = [p for p in paths(doc) if isinstance(p[-1], str) and p[-1] in leaves]
    return [(where[draw(st.integers(0, len(where) - 1))], draw(values)) for _ in range(draw(st.integers(1, 12)))]


def write_doc(path: Path, doc, ops=None) -> None:
    path.write_text(json.dumps(doc, allow_nan=True))
    if ops is not None:
        apply_bytes(path, ops)


# -- runs.json ---------------------------------------------------------------------------------------------------


BASE_RUNS = document()


RUN_NUMBERS = ("baseline", "loss", "dloss", "dloss_ratio_ablate", "predicted")


@FUZZ
@given(changes=json_mutations(BASE_RUNS) | value_mutations(BASE_RUNS, RUN_NUMBERS, odd_numbers),
       ops=st.none() | byte_edits(3000))
def test_fuzz_runs_json(changes, ops):
    from qkinspect.experiment.saved import read_experiment
    from qkinspect.report.analysis.pdf import _experiment
    from qkinspect.report.experiment.figure import experiment_figure
    from qkinspect.report.pages import TextPages

    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        runs = work / "runs.json"
        write_doc(runs, apply_mutations(json.loads(json.dumps(BASE_RUNS)), changes), ops)
        out = work / "fig.png"
        check_cli(["plot", "--kind", "experiment", "--experiment", runs, "-o", out], out, work)
        # the report's experiment section, drawn to nowhere: what passed the check must not fail later
        try:
            with bounded():
                result = read_experiment(runs)
                experiment_figure(result)
                pages = TextPages(lambda fig: None)
                _experiment(pages, result, runs)
                pages.close()
        except InputError:
            pass


def estimated_and_healed() -> dict:
    """A document with every section the records type: estimated runs, the estimate's agreement, healing curves."""
    from qkinspect.documents import json_safe
    from qkinspect.experiment.results import experiment_json
    from tests.experiment.test_saved_experiment import full_result

    return json_safe(experiment_json(full_result()))


BASE_TYPED = estimated_and_healed()
TYPED_NUMBERS = ("dloss_estimate", "dloss_estimate_se", "moved", "rho", "verified", "probes", "diff", "se", "step",
                 "lr", "steps", "batch_windows", "control_loss")


@FUZZ
@given(changes=json_mutations(BASE_TYPED) | value_mutations(BASE_TYPED, TYPED_NUMBERS, odd_numbers),
       ops=st.none() | byte_edits(6000))
def test_fuzz_estimate_and_healing_json(changes, ops):
    """The cost map and the healing figure, and the report's section of an estimated map, from a mutated document
    with an estimate and healing: what the reader lets through draws."""
    from qkinspect.experiment.saved import read_experiment
    from qkinspect.report.analysis.pdf import _experiment
    from qkinspect.report.experiment.costmap import costmap_figure
    from qkinspect.report.experiment.healing import healing_figure
    from qkinspect.report.pages import TextPages

    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        runs = work / "map.json"
        write_doc(runs, apply_mutations(json.loads(json.dumps(BASE_TYPED)), changes), ops)
        for kind in ("costmap", "healing"):
            out = work / f"{kind}.png"
            check_cli(["plot", "--kind", kind, "--experiment", runs, "-o", out], out, work)
        try:
            with bounded():
                result = read_experiment(runs)
                for draw in (costmap_figure, healing_figure):
                    with contextlib.suppress(InputError):  # nothing of that kind left to draw: refused in a line
                        draw(result)
                pages = TextPages(lambda fig: None)
                _experiment(pages, result, runs)
                pages.close()
        except InputError:
            pass


# -- a sweep folder ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sweep_base(tmp_path_factory) -> Path:
    from tests.cli.conftest import save_bert
    from tests.sweep.test_hostile_sweep import write_sweep

    root = tmp_path_factory.mktemp("fuzz_sweep")
    for i, step in enumerate((100, 200)):
        save_bert(root / "run" / f"checkpoint-{step}", seed=i)
    write_sweep(root / "sweep", [str(root / "run" / "checkpoint-100"), str(root / "run" / "checkpoint-200")])
    return root


def result_files(folder: Path) -> list[Path]:
    return sorted((folder / "results").glob("*.json"))


def check_sweep_folder(folder: Path, work: Path, base: Path) -> None:
    """plot and report of the folder (CLI), and what a resumed sweep does before it computes anything."""
    from qkinspect.documents import model_info
    from qkinspect.sweep import discover, engine, keys, store
    from tests.sweep.test_hostile_sweep import OPTIONS

    out = work / "t.png"
    check_cli(["plot", folder, "--kind", "trajectory", "-o", out], out, work)
    out = work / "r.html"
    check_cli(["report", folder, "--html", "-o", out], out, work)
    cks = discover([str(base / "run" / "checkpoint-100"), str(base / "run" / "checkpoint-200")])
    plan = [(ck, key, store.result_path(folder, ck, key)) for ck in cks for key in [keys.result_key(ck, OPTIONS)]]
    with bounded():
        stored, _ = engine._stored(folder, plan, OPTIONS)
        infos = {i: model_info(doc["result"]["model"]) for i, doc in stored.items()}
        try:
            engine._check_before_work(cks, infos, None)
        except InputError:
            pass


sweep_targets = st.sampled_from(["result 0", "result 1", "manifest"])


@FUZZ
@given(target=sweep_targets, data=st.data(), ops=st.none() | byte_edits(4000, 3000))
def test_fuzz_sweep_folder(sweep_base, target, data, ops):
    with tempfile.TemporaryDirectory(dir=sweep_base) as d:
        work = Path(d)
        folder = work / "sweep"
        shutil.copytree(sweep_base / "sweep", folder)
        path = folder / "sweep.json" if target == "manifest" else result_files(folder)[int(target[-1])]
        doc = json.loads(path.read_text())
        if target != "manifest":  # the analysis payload is large: mutate mostly where the checks are
            doc["result"]["layers"] = doc["result"]["layers"][:1]
        if target == "manifest":
            changes = data.draw(json_mutations(doc))
        else:
            metrics = ("symmetry", "head_overlap", "mean", "std", "symmetry_median")
            changes = data.draw(json_mutations(doc) | value_mutations(doc, metrics, odd_metrics))
        write_doc(path, apply_mutations(doc, changes), ops)
        check_sweep_folder(folder, work, sweep_base)


REPLACEMENTS = {
    "fifo": lambda p, other: (p.unlink(), os.mkfifo(p)),
    "/dev/zero": lambda p, other: (p.unlink(), p.symlink_to("/dev/zero")),
    "folder": lambda p, other: (p.unlink(), p.mkdir()),
    "copy of another file": lambda p, other: shutil.copy(other, p),
    "empty": lambda p, other: p.write_bytes(b""),
}


@pytest.mark.parametrize("kind", list(REPLACEMENTS))
def test_sweep_files_replaced(sweep_base, kind):
    """Each result file, and the manifest, replaced by something that is not one."""
    for which in ("result", "manifest"):
        with tempfile.TemporaryDirectory(dir=sweep_base) as d:
            work = Path(d)
            folder = work / "sweep"
            shutil.copytree(sweep_base / "sweep", folder)
            a, b = result_files(folder)
            REPLACEMENTS[kind](*((folder / "sweep.json", a) if which == "manifest" else (b, a)))
            check_sweep_folder(folder, work, sweep_base)


# -- scheduler addresses and what answers there -----------------------------------------------------------------


hosts = st.sampled_from(["127.0.0.1", "localhost", "[::1]", "", "a b", "x/y", "0.0.0.0", "256.1.1.1", "::1",
                         "\x00", "é", "-"]) | st.text(max_size=10)
ports = st.integers(-5, 70000).map(str) | st.sampled_from(["", "abc", "8786a", "８７８６", "1e3", " 1"])
schemes = st.sampled_from(["tcp://", "tls://", "ucx://", "inproc://", "ws://", "http://", "", "tcp:/", "TCP://"])
addresses = st.builds(lambda s, h, sep, p: f"{s}{h}{sep}{p}", schemes, hosts, st.sampled_from([":", "", "::"]), ports)


@FUZZ
@given(address=addresses | st.text(max_size=30))
def test_fuzz_scheduler_addresses(address):
    pytest.importorskip("distributed")
    from qkinspect.sweep import scheduler

    with bounded():
        try:
            checked = scheduler.check_address(address)
        except InputError:
            return
        assert checked.startswith(("tcp://", "tls://"))
        with contextlib.suppress(InputError):
            scheduler.probe(checked, seconds=1.0)  # nothing that answers as a scheduler runs here


u64 = st.integers(0, 2**64 - 1)


def _frame(count: int, lengths: list[int], rest: bytes) -> bytes:
    """Dask's TCP framing: total length, frame count, frame lengths (u64 little-endian), then the bytes."""
    body = count.to_bytes(8, "little") + b"".join(x.to_bytes(8, "little") for x in lengths) + rest
    return len(body).to_bytes(8, "little") + body


frames = (st.binary(max_size=64)
          | st.builds(lambda n, rest: n.to_bytes(8, "little") + rest, u64, st.binary(max_size=32))
          | st.builds(_frame, u64, st.lists(u64, max_size=3), st.binary(max_size=32)))


@FUZZ
@given(reply=frames, close=st.booleans())
def test_fuzz_scheduler_replies(reply, close, capfd):
    """A listener on 127.0.0.1 answering with generated bytes (Dask-like frames with hostile lengths among them):
    the probe ends in InputError within its deadline, quietly."""
    pytest.importorskip("distributed")
    from qkinspect.sweep import scheduler

    with listener(reply, close) as port, bounded():
        t0 = time.perf_counter()
        with pytest.raises(InputError, match=f"^scheduler='tcp://127.0.0.1:{port}': "):
            scheduler.probe(f"tcp://127.0.0.1:{port}", seconds=1.0)
        assert time.perf_counter() - t0 < 1.0 + 6
    assert "Traceback" not in capfd.readouterr().err

