"""The output layer: format choice, serialisers and atomic writes (qkinspect/cli/output.py)."""

from __future__ import annotations

import csv
import io
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from qkinspect.cli.output import Document, atomic_write, choose_format, emit, write_csv, write_ndjson
from qkinspect.documents import json_safe
from qkinspect.errors import InputError, OutputError, one_line


@pytest.mark.parametrize("fmt, output, tty, expected", [
    ("csv", None, True, "csv"),
    ("table", Path("x.json"), False, "table"),  # an explicit format wins over the extension
    (None, Path("x.json"), True, "json"),
    (None, Path("x.JSONL"), True, "ndjson"),
    (None, Path("x.ndjson"), True, "ndjson"),
    (None, Path("x.csv"), True, "csv"),
    (None, Path("x.txt"), False, "table"),
    (None, None, True, "table"),
    (None, None, False, "json"),  # a pipe gets JSON
])
def test_choose_format(fmt, output, tty, expected):
    assert choose_format(fmt, output, isatty=tty) == expected


def test_choose_format_refuses_unknown_extension():
    with pytest.raises(InputError, match="cannot tell the format"):
        choose_format(None, Path("out.xlsx"))
    with pytest.raises(InputError, match="not one of"):
        choose_format("yaml", None)


def test_json_safe():
    """The one JSON-safe copy (records.json_safe) that the library's documents and the CLI's output both use."""
    x = {"a": float("nan"), "b": np.float32(0.5), "c": np.arange(2), "d": (1, 1j), "e": [math.inf], 3: Path("p"),
         "f": np.int64(7), "g": complex(math.nan, 2), "h": np.bool_(True)}
    assert json_safe(x) == {"a": None, "b": 0.5, "c": [0, 1], "d": [1, [0.0, 1.0]], "e": [None], "3": "p", "f": 7,
                            "g": [None, 2.0], "h": True}
    json.dumps(json_safe(x), allow_nan=False)


def test_one_line_plain_and_typed():
    """errors.one_line: a message on one line; `typed` (a third-party library's exception, loading.boundary) names
    the type where the message alone says little and cuts a long message."""
    assert one_line(ValueError("a  b\n c")) == one_line(ValueError("a  b\n c"), typed=True) == "a b c"
    assert one_line(KeyError("x")) == "'x'" and one_line(KeyError("x"), typed=True) == "KeyError: 'x'"
    assert one_line(RuntimeError()) == one_line(RuntimeError(), typed=True) == "RuntimeError"
    assert len(one_line(OSError("y" * 400))) == 400 and one_line(OSError("y" * 400), typed=True) == "y" * 300


def test_csv_is_tidy_with_header_and_empty_nan():
    buf = io.StringIO()
    write_csv([{"layer": 0, "head": 1, "symmetry": float("nan")}, {"layer": 0, "head": 2, "symmetry": 0.25}], buf)
    rows = list(csv.DictReader(io.StringIO(buf.getvalue())))
    assert rows == [{"layer": "0", "head": "1", "symmetry": ""}, {"layer": "0", "head": "2", "symmetry": "0.25"}]


def test_ndjson_one_object_per_line():
    buf = io.StringIO()
    write_ndjson([{"a": 1}, {"a": float("nan")}], buf)
    assert [json.loads(line) for line in buf.getvalue().splitlines()] == [{"a": 1}, {"a": None}]


def test_atomic_write_replaces_whole_file(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old")
    atomic_write(target, lambda f: f.write("new"))
    assert target.read_text() == "new"
    assert os.listdir(tmp_path) == ["out.json"]


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_interrupted_write_leaves_old_file_and_no_temp(tmp_path, exc):
    target = tmp_path / "out.json"
    target.write_text("old")

    def writer(f):
        f.write("partial")
        raise exc

    with pytest.raises(type(exc)):
        atomic_write(target, writer)
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["out.json"]


def test_interrupted_first_write_leaves_nothing(tmp_path):
    def writer(f):
        f.write("partial")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "new.csv", writer)
    assert os.listdir(tmp_path) == []


def test_unwritable_targets(tmp_path):
    with pytest.raises(OutputError, match="does not exist"):
        atomic_write(tmp_path / "missing" / "x.json", lambda f: f.write("x"))
    with pytest.raises(OutputError, match="is a folder"):
        atomic_write(tmp_path, lambda f: f.write("x"))
    (tmp_path / "file").write_text("")
    with pytest.raises(OutputError, match="is not a folder"):
        atomic_write(tmp_path / "file" / "x.json", lambda f: f.write("x"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores folder permissions")
def test_read_only_folder(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(OutputError, match="not writable"):
            atomic_write(ro / "x.json", lambda f: f.write("x"))
    finally:
        ro.chmod(0o700)


def test_emit_to_file_by_extension(tmp_path, capsys):
    doc = Document(json={"schema": "qkinspect/1"}, rows=[{"x": 1}], render=lambda c: c.print("table!"))
    assert emit(doc, None, tmp_path / "r.csv") == "csv"
    assert (tmp_path / "r.csv").read_text() == "x\n1\n"
    assert emit(doc, None, tmp_path / "r.txt") == "table"
    assert (tmp_path / "r.txt").read_text().strip() == "table!"
    out = capsys.readouterr()
    assert out.out == ""  # results went to the files, notes to stderr
    assert "wrote csv" in out.err


def test_progress_only_on_a_terminal_and_after_the_delay(monkeypatch):
    import sys

    from qkinspect.cli.output import Progress

    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    p = Progress("x", delay=0.0)
    p(1, 3)
    assert p._bar is None  # a pipe or a log: no bar
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    slow = Progress("x", delay=3600.0)
    slow(1, 3)
    assert slow._bar is None  # short work: no bar
    slow.close()
    slow._timer.join(5)
    assert slow._bar is None and not slow._timer.is_alive()  # closing cancels the pending bar
    fast = Progress("x", delay=0.0)
    try:
        fast(1, 3)
        assert fast._bar is not None
        assert fast._bar.tasks[0].completed == 1 and fast._bar.tasks[0].total == 3
    finally:
        fast.close()
    assert fast._bar is None


def test_the_bar_appears_while_the_first_step_still_runs(monkeypatch):
    """progress(0, N) and then nothing for a while (the first layer of a GGUF being dequantised): the bar shows
    after the delay anyway, at 0 of N, and is gone once closed; a run that ends before the delay never shows one."""
    import sys
    import time

    from qkinspect.cli.output import Progress

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    p = Progress("x", delay=0.2)
    try:
        p(0, 5)
        assert p._bar is None
        deadline = time.monotonic() + 10
        while p._bar is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert p._bar is not None and p._bar.tasks[0].completed == 0 and p._bar.tasks[0].total == 5
        p(1, 5)
        assert p._bar.tasks[0].completed == 1
    finally:
        p.close()
    assert p._bar is None
    quick = Progress("x", delay=0.2)
    quick(0, 5)
    quick(5, 5)
    quick.close()
    time.sleep(0.4)
    assert quick._bar is None
