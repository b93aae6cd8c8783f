"""Issue 25, class 1: every text and JSON file is read bounded (a regular file, at most a fixed number of bytes;
a FIFO or a device is refused without blocking), and every amount an option asks for is capped before any work."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from qkinspect.errors import CheckpointError, InputError
from qkinspect.reading import MAX_DEPTH, read_bytes, read_json, read_text
from tests.one_line import one_error_line

SECONDS = 10.0  # each refusal below is immediate; this only guards against a hang


@contextlib.contextmanager
def endless_writer(fifo: Path):
    """A FIFO with a writer that never stops (what `--text <(yes)` is); the writer is ended afterwards."""
    os.mkfifo(fifo)
    stop = threading.Event()

    def write() -> None:
        with contextlib.suppress(OSError):
            fd = os.open(fifo, os.O_WRONLY)  # blocks until a reader opens it, if any ever does
            try:
                while not stop.is_set():
                    os.write(fd, b"y\n" * 4096)
            finally:
                os.close(fd)

    t = threading.Thread(target=write, daemon=True)
    t.start()
    try:
        yield fifo
    finally:
        stop.set()
        with contextlib.suppress(OSError):  # unblock a writer still waiting in open()
            fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
            os.close(fd)
        t.join(5)


@contextlib.contextmanager
def bounded(seconds: float = SECONDS, memory: int = 64 << 20):
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - t0 < seconds and peak < memory, (time.perf_counter() - t0, peak)


# -- the reader ------------------------------------------------------------------------------------------------


def hostile_files(tmp_path: Path) -> dict[str, Path]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "zero-link").symlink_to("/dev/zero")
    (tmp_path / "fifo-link").symlink_to(fifo)
    (tmp_path / "folder").mkdir()
    return {"fifo": fifo, "/dev/zero": Path("/dev/zero"), "link to /dev/zero": tmp_path / "zero-link",
            "link to a FIFO": tmp_path / "fifo-link", "/dev/null": Path("/dev/null"), "folder": tmp_path / "folder"}


@pytest.mark.parametrize("name", ["fifo", "/dev/zero", "link to /dev/zero", "link to a FIFO", "/dev/null", "folder"])
def test_only_regular_files_are_read(tmp_path, name):
    path = hostile_files(tmp_path)[name]
    with bounded(), pytest.raises(InputError, match=f"^{path}: is a .*, not a regular file; refused as a thing$"):
        read_bytes(path, limit=1 << 20, what="a thing")


def test_a_fifo_with_an_endless_writer_is_refused(tmp_path):
    with endless_writer(tmp_path / "yes") as fifo, bounded(), pytest.raises(InputError, match="is a FIFO"):
        read_text(fifo, limit=1 << 20, what="--text", prefix=True)


def test_larger_files_are_refused_or_cut(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:  # sparse: 100 MiB that take no disk
        f.truncate(100 << 20)
    with bounded(), pytest.raises(InputError, match=r"big.json: 104857600 bytes, more than the 1 MiB a doc may have"):
        read_bytes(big, limit=1 << 20, what="a doc")
    with bounded(memory=8 << 20):
        assert len(read_bytes(big, limit=1 << 20, prefix=True)) == 1 << 20


def test_a_prefix_never_cuts_a_character_in_two(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("é" * 10)  # two bytes each
    assert read_text(f, limit=5, prefix=True) == "éé"
    with pytest.raises(InputError, match="not UTF-8 text"):
        (tmp_path / "b.txt").write_bytes(b"ok \xff\xfe")
        read_text(tmp_path / "b.txt", limit=100)


def test_json_depth_and_constants(tmp_path):
    f = tmp_path / "d.json"
    f.write_text("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    with pytest.raises(InputError, match=f"nested more than {MAX_DEPTH} levels"):
        read_json(f, what="x")
    f.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(InputError, match=f"nested more than {MAX_DEPTH} levels"):
        read_json(f, what="x")
    f.write_text('{"a": NaN}')
    with pytest.raises(InputError, match="NaN is not a JSON number"):
        read_json(f, what="x")
    f.write_text("[" * MAX_DEPTH + "]" * MAX_DEPTH)
    assert read_json(f) is not None


def test_missing_and_unreadable(tmp_path):
    with pytest.raises(CheckpointError, match="nope.json: file is missing"):
        read_json(tmp_path / "nope.json", error=CheckpointError)


# -- experiment --text, --tokens, --window --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["fifo", "/dev/zero", "link to /dev/zero", "folder"])
def test_experiment_text_must_be_a_regular_file(cli, tiny_bert, tmp_path, name):
    path = hostile_files(tmp_path)[name]
    t0 = time.perf_counter()
    line = one_error_line(cli("experiment", tiny_bert, "--text", path, "--tokens", "64"))
    assert line.startswith(f"error: {path}: is a ") and "not a regular file; refused as --text" in line
    assert time.perf_counter() - t0 < SECONDS


def test_experiment_text_from_an_endless_fifo(cli, tiny_bert, tmp_path):
    with endless_writer(tmp_path / "yes") as fifo:
        line = one_error_line(cli("experiment", tiny_bert, "--text", fifo, "--tokens", "64"))
    assert "is a FIFO" in line


def test_only_the_text_tokens_need_is_read(tmp_path):
    from qkinspect.experiment.model.scoring import read_text as read_experiment_text
    from qkinspect.experiment.requests import BYTES_PER_TOKEN
    from qkinspect.reading import MAX_TEXT_BYTES

    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.write(b"word " * 1000)
        f.truncate(1 << 30)  # 1 GiB, mostly a hole of zero bytes (valid UTF-8: NUL characters)
    with bounded(memory=16 << 20):
        text = read_experiment_text(big, tokens=64)
    assert len(text.text) == 1 << 20 and text.text.startswith("word word")
    assert len(read_experiment_text(big, tokens=100_000).text) == 100_000 * BYTES_PER_TOKEN
    with bounded(seconds=30, memory=4 * MAX_TEXT_BYTES):
        assert len(read_experiment_text(big, tokens=1 << 24).text) == MAX_TEXT_BYTES


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--tokens", "1000000000000", "--tokens 1000000000000: at most 16777216 (2**24) tokens"),
    ("--window", "1000000000000", "--window 1000000000000: at most 16777216 (2**24) tokens"),
    ("--tokens", "16777217", "--tokens 16777217: at most 16777216"),
    ("--tokens", "1", "--tokens 1 / --window 512: both must be at least 2"),
])
def test_experiment_amounts_are_capped_before_any_work(cli, tmp_path, option, value, message):
    t0 = time.perf_counter()
    line = one_error_line(cli("experiment", tmp_path / "no-such-model", option, value))
    assert message in line
    assert time.perf_counter() - t0 < SECONDS  # refused before the model (missing here) is looked for


def test_run_experiment_caps_too(tmp_path):
    from qkinspect.experiment import run_experiment

    with pytest.raises(InputError, match="tokens=1000000000000: at most"):
        run_experiment(tmp_path / "no-such-model", "share_qk", tokens=10**12)


# -- runs.json and sweep files -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["fifo", "/dev/zero", "link to /dev/zero", "link to a FIFO"])
def test_plot_experiment_refuses_non_regular_runs(cli, tmp_path, name):
    path = hostile_files(tmp_path)[name]
    line = one_error_line(cli("plot", "--kind", "experiment", "--experiment", path, "-o", tmp_path / "x.png"))
    assert "not a regular file; refused as an experiment document" in line
    assert not (tmp_path / "x.png").exists()


def test_report_experiment_refuses_a_huge_runs_file(cli, tiny_bert, tmp_path):
    runs = tmp_path / "runs.json"
    with open(runs, "wb") as f:
        f.truncate(65 << 20)
    line = one_error_line(cli("report", tiny_bert, "--experiment", runs, "-o", tmp_path / "r.pdf"))
    assert "runs.json: 68157440 bytes, more than the 64 MiB an experiment document may have" in line


@pytest.mark.parametrize("name", ["fifo", "/dev/zero", "link to /dev/zero", "link to a FIFO"])
def test_sweep_files_that_are_not_regular(tmp_path, name):
    from qkinspect.sweep import Checkpoint
    from qkinspect.sweep.keys import result_key
    from qkinspect.sweep.store import MANIFEST, load_result, read_sweep, result_path

    target = hostile_files(tmp_path)[name]
    folder = tmp_path / "sweep"
    ck = Checkpoint("x", None, "x", "x#0")
    key = result_key(ck, {})
    path = result_path(folder, ck, key)
    path.parent.mkdir(parents=True)
    if name == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(target)
    with bounded(), pytest.raises(InputError, match=f"^{path}: is a (FIFO|link)"):
        load_result(folder, ck, key, {})  # a resumed sweep computes it again; plot and report refuse it
    (folder / MANIFEST).symlink_to(target)
    with bounded(), pytest.raises(InputError, match="not a regular file"):
        read_sweep(folder)


def test_config_json_that_is_a_fifo(cli, tiny_bert, tmp_path):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model)
    (model / "config.json").unlink()
    os.mkfifo(model / "config.json")
    line = one_error_line(cli("analyze", model))
    assert "config.json" in line  # refused before it is opened (not a regular file)


# -- sweep --workers and --threads; analyze(threads=) -------------------------------------------------------


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--workers", "1000", "--workers: 1000 is more than the"),
    ("--workers", "0", "--workers: 0 must be at least 1"),
    ("--threads", "1000000", "--threads: 1000000 is more than the 1024 torch threads a task may use"),
    ("--threads", "0", "--threads: 0 must be at least 1"),
])
def test_sweep_workers_and_threads_are_capped(cli, tiny_bert, tmp_path, option, value, message):
    pytest.importorskip("distributed")
    out = tmp_path / "sweep"
    line = one_error_line(cli("sweep", tiny_bert, "--out", out, option, value, "--format", "json"))
    assert message in line
    assert not out.exists()


def test_the_worker_cap_follows_the_cores(monkeypatch):
    from qkinspect import limits

    monkeypatch.setattr(limits, "cores", lambda: 3)
    limits.check_workers(12)
    with pytest.raises(InputError, match="^workers: 13 is more than the 12 local worker processes .* 3 cores"):
        limits.check_workers(13)
    with pytest.raises(InputError, match="^--workers: 13 is more than"):
        limits.check_workers(13, "--workers")  # as the CLI names it


def test_run_sweep_checks_before_anything(tmp_path):
    pytest.importorskip("distributed")
    from qkinspect.sweep import Checkpoint, run_sweep

    ck = Checkpoint("x", None, "x", "x#0")
    with pytest.raises(InputError, match="^threads: 2000 is more than"):
        run_sweep([ck], {}, tmp_path / "s", threads=2000)
    with pytest.raises(InputError, match="^workers sizes the local cluster; with scheduler the cluster's own"):
        run_sweep([ck], {}, tmp_path / "s", workers=2, scheduler="tcp://127.0.0.1:1")
    assert not (tmp_path / "s").exists()


def test_analyze_threads_capped(tiny_bert):
    import qkinspect

    with pytest.raises(InputError, match="threads: 1000000 is more than the 1024"):
        qkinspect.analyze(tiny_bert, threads=1_000_000)
