"""Odd options and output paths (issue classes 2, 4, 5 and 6): ranges bounded before they are built, a closed pipe
ends quietly, -o writes through links and straight to FIFOs and devices, and never leaves a temporary file."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from qkinspect.analysis.request import CLI_NAMES, check_request
from qkinspect.errors import InputError, OutputError
from qkinspect.files import atomic_write, atomic_write_file, check_writable
from qkinspect.selection import MAX_INDEX, parse_indices
from tests.one_line import one_error_line

QK = [sys.executable, "-m", "qkinspect"]


# -- class 2: ranges are bounded before they are built ------------------------------------------------------


@pytest.mark.parametrize("text", ["0-1000000000000", "5,0-10000000", f"{MAX_INDEX}", "0-99999999999999999999999"])
def test_huge_ranges_are_refused_without_building_them(text):
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(InputError, match="--layers: .* is out of range"):
            parse_indices(text, "--layers")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - t0 < 0.5 and peak < 1_000_000


def test_largest_allowed_range_is_cheap():
    assert len(parse_indices(f"0-{MAX_INDEX - 1}", "--heads")) == MAX_INDEX


def test_cli_huge_layer_and_head_ranges_exit_2(cli, tiny_bert):
    for opt in ("--layers", "--heads"):
        line = one_error_line(cli("analyze", tiny_bert, opt, "0-1000000000000"))
        assert f"{opt}: 1000000000000 is out of range" in line
    # within the bound, the model's own sizes decide
    assert "has layers 0-1" in one_error_line(cli("analyze", tiny_bert, "--layers", "0-50000"))


@pytest.mark.parametrize("value", ["", ",", " , "])
def test_empty_metrics_are_refused(cli, tiny_bert, value):
    assert "--metrics: no names given" in one_error_line(cli("analyze", tiny_bert, "--metrics", value))
    with pytest.raises(InputError, match="--metrics: no names given"):
        check_request([value], names=CLI_NAMES)


# -- class 6: an empty selection names the model ------------------------------------------------------------


def test_empty_selection_names_the_model(cli, tiny_bert, monkeypatch):
    import dataclasses

    from qkinspect.analysis import run

    real = run.analyze

    def nothing(*a, **kw):  # a selection that passes the range checks yet matches nothing (mixed blocks)
        return dataclasses.replace(real(*a, **kw), heads=[])

    monkeypatch.setattr(run, "analyze", nothing)
    line = one_error_line(cli("analyze", tiny_bert, "--layers", "1", "--heads", "2"))
    assert line == f"error: {tiny_bert.name}: the selection (--layers 1 --heads 2) matched no heads of this model"


# -- class 4: a reader that closes the pipe early -----------------------------------------------------------


@pytest.fixture
def closed_stdout(monkeypatch, capsys):
    """sys.stdout becomes a pipe whose reader is already gone (what `| head -1` becomes once head has read its
    line): every write or flush fails with EPIPE, deterministically. Yields a function running the CLI in-process
    that returns (exit code, stderr)."""
    import io

    from qkinspect.cli.app import app

    def run(*args: str) -> tuple[int, str]:
        r, w = os.pipe()
        os.close(r)
        out = io.TextIOWrapper(os.fdopen(w, "wb"), encoding="utf-8")
        monkeypatch.setattr(sys, "stdout", out)
        capsys.readouterr()
        try:
            with pytest.raises(SystemExit) as e:
                app([str(a) for a in args])
        finally:
            monkeypatch.undo()
            with contextlib.suppress(OSError):
                out.close()
        return e.value.code, capsys.readouterr().err

    return run


@pytest.mark.parametrize("args", [
    ("analyze", "{m}", "--format", "table"), ("analyze", "{m}", "--format", "json"),
    ("analyze", "{m}", "--format", "csv"), ("analyze", "{m}", "--format", "ndjson"),
    ("info", "{m}", "--format", "table"), ("info", "{m}"), ("spectrum", "{m}", "--format", "csv"),
    ("spectrum", "{m}", "--format", "table"), ("compare", "{m}", "{m}", "--format", "table"),
    ("compare", "{m}", "{m}", "--format", "json"), ("--help",), ("analyze", "--help"), ("--version",),
], ids=lambda a: "-".join(x for x in a if x != "{m}"))
def test_closed_pipe_exits_0_quietly(tiny_bert, closed_stdout, args):
    code, err = closed_stdout(*(a.format(m=tiny_bert) for a in args))
    assert code == 0 and err == "", err


def run_into_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    """The real executable, stdout a pipe whose reader is gone."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run([*QK, *args], stdout=w, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(w)


def test_closed_pipe_real_exit_path(tiny_bert):
    for args in (["--version"], ["info", str(tiny_bert), "--format", "table"]):
        p = run_into_closed_pipe(*args)
        assert p.returncode == 0 and p.stderr == "", (args, p.stderr)


def test_head_dash_1_in_a_shell(tiny_bert):
    p = subprocess.run(f"set -o pipefail; {' '.join(QK)} analyze {tiny_bert} --format table | head -1",
                       shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stderr == "" and len(p.stdout.splitlines()) == 1


# -- class 5: what -o names ---------------------------------------------------------------------------------


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_symlink_is_written_through(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "out.json"
    target.write_text("old")
    target.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(Path("real") / "out.json")
    atomic_write(link, lambda f: f.write("new"))
    assert link.is_symlink() and target.read_text() == "new"
    assert (target.stat().st_mode & 0o777) == 0o640  # the file written through keeps its permissions
    assert leftovers(tmp_path) == leftovers(tmp_path / "real") == []


def test_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "link.csv"
    link.symlink_to(tmp_path / "made.csv")
    atomic_write_file(link, lambda tmp: tmp.write_text("a,b\n"))
    assert link.is_symlink() and (tmp_path / "made.csv").read_text() == "a,b\n"


def test_link_to_a_missing_folder_is_refused(tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "nowhere" / "x.json")
    with pytest.raises(OutputError, match="link.json \\(a link to .*nowhere/x.json\\): .*nowhere does not exist"):
        check_writable(link)


def test_fifo_is_written_straight_to(tmp_path):
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    atomic_write_file(fifo, lambda tmp: tmp.write_bytes(b"binary \x00 data"))  # a writer that needs a name
    reader.join(10)
    assert got == [b"binary \x00 data"]
    assert fifo.exists() and not fifo.is_file()  # still a FIFO
    assert leftovers(tmp_path) == []


def test_cli_writes_through_a_fifo(cli, tiny_bert, tmp_path):
    fifo = tmp_path / "out.csv"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    r = cli("analyze", tiny_bert, "--layers", "0", "-o", fifo)
    reader.join(10)
    assert r.exit_code == 0, r.stderr
    assert got[0].startswith("model,block,layer,head") and len(got[0].splitlines()) == 5
    assert not fifo.is_file()


@pytest.mark.parametrize("device", ["/dev/null", "/dev/stdout"])
def test_character_devices_are_written_not_replaced(tiny_bert, device):
    before = os.stat(device, follow_symlinks=True)
    p = subprocess.run([*QK, "info", str(tiny_bert), "--format", "json", "-o", device], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    after = os.stat(device, follow_symlinks=True)
    assert (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)
    if device == "/dev/stdout":
        assert '"kind": "info"' in p.stdout
    assert not any(n.startswith(".null.") or n.startswith(".stdout.") for n in os.listdir("/dev"))


def test_dash_means_stdout(cli, tiny_bert, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = cli("analyze", tiny_bert, "--layers", "0", "--format", "ndjson", "-o", "-")
    assert r.exit_code == 0, r.stderr
    assert len(r.stdout.splitlines()) == 4 and list(tmp_path.iterdir()) == []


def signal_ignored(sig: signal.Signals) -> str | None:
    """Why sending `sig` to a child of this process tells nothing, or None: an ignored signal stays ignored across
    exec (a suite run under `nohup` ignores SIGHUP), and the writer leaves an ignored signal ignored, as it should."""
    if signal.getsignal(sig) == signal.SIG_IGN:
        return f"{sig.name} is ignored in this process (run under nohup?), so the child ignores it too"
    return None


def test_an_ignored_signal_is_seen(monkeypatch):
    assert signal_ignored(signal.SIGTERM) is None or signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    monkeypatch.setattr(signal, "getsignal", lambda s: signal.SIG_IGN if s == signal.SIGHUP else signal.SIG_DFL)
    assert "SIGHUP is ignored" in signal_ignored(signal.SIGHUP) and signal_ignored(signal.SIGTERM) is None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_no_temporary_file_after_sigterm_or_sighup(tmp_path, sig):
    """A writer that stalls after its temporary file exists is signalled: the file is removed, the target is
    untouched, and the process ends as the signal says."""
    if why := signal_ignored(sig):
        pytest.skip(why)
    script = f"""
import sys, time
from pathlib import Path
from qkinspect.cli.app import QkGroup
from qkinspect.files import atomic_write
def stall(f):
    f.write("partial")
    f.flush()
    print("ready", flush=True)
    time.sleep(60)
try:
    atomic_write(Path({str(tmp_path / 'out.json')!r}), stall)
except SystemExit as e:
    print("cleaned", e.code, flush=True)
    raise
"""
    (tmp_path / "out.json").write_text("old")
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert p.stdout.readline().strip() == "ready"
    assert len(leftovers(tmp_path)) == 1  # the temporary file exists now
    p.send_signal(sig)
    out, _ = p.communicate(timeout=30)
    assert out.strip() == f"cleaned {128 + sig}" and p.returncode == 128 + sig
    assert leftovers(tmp_path) == [] and (tmp_path / "out.json").read_text() == "old"


def test_cli_dies_by_the_signal_after_cleaning_up(tmp_path, tiny_bert):
    """The real command: SIGTERM while extract streams into its temporary file."""
    out = tmp_path / "heads.safetensors"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    code = ("import time, sys\n"
            "import qkinspect.extract.run as ex\n"
            "real = ex._write_layer\n"
            "def slow(w, layer):\n"
            "    print('ready', flush=True); time.sleep(60); return real(w, layer)\n"
            "ex._write_layer = slow\n"
            "from qkinspect.cli.app import main\n"
            f"sys.argv = ['qkinspect', 'extract', {str(tiny_bert)!r}, '-o', {str(out)!r}]\n"
            "main()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env)
    assert p.stdout.readline().strip() == "ready"
    assert len(leftovers(tmp_path)) == 1
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == -signal.SIGTERM, err  # ended by the signal itself, as without qkinspect's handler
    assert leftovers(tmp_path) == [] and not out.exists()
