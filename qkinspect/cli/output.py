"""Where results go and in what form, decided in one place for every command.

A command builds a `Document` (a JSON-ready dict, tidy rows, and a rich rendering) and calls `emit`:

- `--format table|json|ndjson|csv`; with `-o FILE` and no format, the extension decides (`.json`, `.ndjson`/`.jsonl`,
  `.csv`, `.txt` for the table); without either, a terminal gets a table and a pipe gets JSON.
- Results go to stdout or the file and nowhere else; notes, warnings and progress bars go to stderr.
- Files are written atomically (a temporary file in the same folder, then `os.replace`), links are written through
  and FIFOs, devices and `-o -` straight to (`qkinspect.files`), so an interrupted run never leaves a partial
  file. `check_writable` lets a command fail before a long computation.
- A reader that closes the pipe early (`| head`) ends the command quietly (see `qkinspect.cli.app`).

Example:
    >>> doc = Document(json={"schema": "qkinspect/1", "kind": "demo"}, rows=[{"layer": 0, "symmetry": 0.5}],
    ...                render=lambda console: console.print("layer 0: 0.5"))
    >>> emit(doc, fmt=None, output=Path("out.csv"))   # writes a CSV with a header row
"""

from __future__ import annotations

import contextlib
import io
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import IO, Any

from qkinspect.documents import json_safe
from qkinspect.errors import InputError, OutputError
from qkinspect.files import STDOUT, atomic_write, check_writable
from qkinspect.formats import EXTENSIONS, TABLE_FILE_WIDTH, parquet_file, write_csv, write_ndjson
from qkinspect.formats import write_table as format_table
from qkinspect.suggest import did_you_mean

FORMATS = ("table", "json", "ndjson", "csv")


@dataclass
class Document:
    """One command's result in every form: `json` (the whole document), `rows` (tidy rows for csv/ndjson),
    `render` (draws the human table on a rich Console)."""

    json: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    render: Callable[[Any], None] | None = None


def choose_format(fmt: str | Enum | None, output: Path | None, *, isatty: bool | None = None) -> str:
    """The format to write: explicit, else from -o's extension, else table on a terminal, JSON in a pipe."""
    if fmt is not None:
        name = fmt.value if isinstance(fmt, Enum) else str(fmt)
        if name not in FORMATS:
            raise InputError(f"--format: {name!r} is not one of {', '.join(FORMATS)}{did_you_mean(name, FORMATS)}")
        return name
    if output is not None and str(output) != STDOUT:
        ext = output.suffix.lower()
        if ext not in EXTENSIONS:
            raise InputError(f"-o {output}: cannot tell the format from {ext or 'no extension'!r}; "
                             f"use --format or one of {', '.join(EXTENSIONS)}")
        return EXTENSIONS[ext]
    tty = sys.stdout.isatty() if isatty is None else isatty
    return "table" if tty else "json"


def check_output(fmt: str | Enum | None, output: Path | None) -> None:
    """Refuse a bad format, an extension that names none, or an unwritable -o, before any work."""
    choose_format(fmt, output, isatty=False)
    if output is not None:
        check_writable(output)


def check_parquet(fmt: str | Enum | None, output: Path | None) -> bool:
    """Whether Parquet is asked for (`--format parquet`, or -o FILE.parquet with no format); refused before any
    work when it cannot be written: Parquet needs -o FILE and pyarrow."""
    name = fmt.value if isinstance(fmt, Enum) else fmt
    if name != "parquet" and not (name is None and output is not None and output.suffix.lower() == ".parquet"):
        return False
    if output is None or str(output) == STDOUT:
        raise InputError("--format parquet writes a file: give -o FILE.parquet")
    import importlib.util

    if importlib.util.find_spec("pyarrow") is None:
        raise InputError("Parquet output needs pyarrow: pip install pyarrow")
    check_writable(output)
    return True


def write_parquet(data: list[dict[str, Any]] | dict[str, Any], output: Path) -> None:
    """Rows (a list of dicts) or columns (name -> array) as a Parquet file, written atomically."""
    from qkinspect.files import atomic_write_file

    atomic_write_file(output, lambda tmp: parquet_file(data, tmp))
    note(f"wrote parquet to {output}")


# -- serialisers (qkinspect.formats: every result's save(path) writes the same bytes) ------------------------

def write_json(doc: dict[str, Any], f: IO[str]) -> None:
    from qkinspect.files import write_json as write_document

    write_document(json_safe(doc), f)


def write_table(doc: Document, f: IO[str], *, terminal: bool, width: int = TABLE_FILE_WIDTH) -> None:
    format_table(doc.render, lambda: doc.json, f, terminal=terminal, width=width)


def emit(doc: Document, fmt: str | Enum | None, output: Path | None) -> str:
    """Write `doc` in the chosen format to `output` (atomically) or to stdout; returns the format used."""
    name = choose_format(fmt, output)
    if output is None or str(output) == STDOUT:
        try:
            _write(doc, name, sys.stdout, terminal=sys.stdout.isatty())
            sys.stdout.flush()
        except BrokenPipeError:
            raise
        except OSError as e:  # a full disk behind a redirection, ...
            raise OutputError(f"stdout: cannot write ({e.strerror or e})") from None
    else:
        atomic_write(output, lambda f: _write(doc, name, f, terminal=False))
        note(f"wrote {name} to {output}")
    return name


def _write(doc: Document, name: str, f: IO[str], *, terminal: bool) -> None:
    if name == "json":
        write_json(doc.json, f)
    elif name == "ndjson":
        write_ndjson(doc.rows, f)
    elif name == "csv":
        write_csv(doc.rows, f)
    else:
        write_table(doc, f, terminal=terminal)


def render_text(doc: Document, width: int = TABLE_FILE_WIDTH) -> str:
    """The table as plain text (tests, README)."""
    buf = io.StringIO()
    write_table(doc, buf, terminal=False, width=width)
    return buf.getvalue()


# -- stderr: notes, warnings, progress ---------------------------------------------------------------------

def note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr)


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


QUIET = {"on": False}  # `qkinspect --quiet`: no progress bars (notes and warnings still print)


class Progress:
    """A progress receiver (qkinspect.progress) that shows a rich bar on stderr once work has run for `delay`
    seconds, and only when stderr is a terminal and the run is not `--quiet` (pipes and logs stay clean). The bar
    appears on time even while the first step is still running (a timer starts it; rich's own refresh keeps the
    elapsed time moving), not only at the next call.

    Called as `progress(done, total)` it is one bar under `label`; told `phase(name, total, unit)` the bar takes
    the phase's name, counts its units (`3/16 probes`; a phase it cannot count shows its elapsed time) and shows
    the status text of each call (the training loss)."""

    def __init__(self, label: str, delay: float = 1.0):
        self.label, self.delay = label, delay
        self._t0 = time.monotonic()
        self._bar = None
        self._task = None
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._done, self._total, self._unit, self._status = 0, 0, "", ""
        self._enabled = sys.stderr.isatty() and not QUIET["on"]
        self.phases: list[tuple[str, int | None, str]] = []  # every phase begun, in order (what a test can check)

    def phase(self, name: str, total: int | None, unit: str = "") -> None:
        with self._lock:
            self.phases.append((name, total, unit))
            self.label, self._done, self._total, self._unit, self._status = name, 0, total, unit, ""
            if self._bar is not None:  # each phase's time counts from its start
                self._bar.reset(self._task, total=total, completed=0, description=name, count=self._count(),
                                status="")
            self._show()

    def __call__(self, done: int, total: int | None, status: str = "") -> None:
        with self._lock:
            self._done, self._total, self._status = done, total, status
            self._show()

    def _pending(self) -> bool:
        """Work is under way: a phase that cannot be counted, or one not finished."""
        return self._total is None or self._done < self._total

    def _show(self) -> None:
        if not self._enabled or self._closed:
            return
        if self._bar is None and self._pending():
            wait = self.delay - (time.monotonic() - self._t0)
            if wait <= 0:
                self._start()
            elif self._timer is None:
                self._timer = threading.Timer(wait, self._on_time)
                self._timer.daemon = True
                self._timer.start()
        if self._bar is not None:
            self._bar.update(self._task, description=self.label, completed=self._done, total=self._total,
                             count=self._count(), status=self._status)

    def _count(self) -> str:
        """`3/16 probes`; nothing for a phase that cannot be counted (its bar pulses, its time runs)."""
        return "" if self._total is None else f"{self._done}/{self._total} {self._unit}".rstrip()

    def _on_time(self) -> None:
        with self._lock:
            if self._bar is None and not self._closed and self._pending():
                self._start()

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        bar = RichProgress(TextColumn("{task.description}"), BarColumn(bar_width=20),
                           TextColumn("{task.fields[count]}"), TimeElapsedColumn(), TextColumn("{task.fields[status]}"),
                           console=Console(stderr=True), transient=True)
        bar.start()
        self._task = bar.add_task(self.label, total=self._total, completed=self._done, count=self._count(),
                                  status=self._status)
        self._bar = bar  # last: a bar is never seen without its task

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            if self._bar is not None:
                self._bar.stop()
                self._bar = None


@contextlib.contextmanager
def progress(label: str, delay: float = 1.0) -> Iterator[Progress]:
    """Context manager around `Progress` that always removes the bar.

    Example:
        >>> with progress("analysing") as p:
        ...     result = qkinspect.analyze(None, progress=p)
    """
    p = Progress(label, delay)
    try:
        yield p
    finally:
        p.close()
