"""What the sweep engine's commands (sweep, atlas, directions' batch form) share: the engine's options
(--scheduler, --workers, --threads), the format of their tables (Parquet too), the checks before any work, one
progress line per task and writing the table. Not a command: commands import it, never each other.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from qkinspect.cli.options import RecordFormat
from qkinspect.cli.output import Document, check_output, check_parquet, emit, write_parquet
from qkinspect.errors import InputError

SchedulerOpt = Annotated[str | None, typer.Option(
    "--scheduler", metavar="ADDRESS",
    help="A running Dask scheduler (tcp://host:8786) whose workers can read the checkpoints; default: a local "
         "cluster on this machine.")]
WorkersOpt = Annotated[int | None, typer.Option(
    "--workers", metavar="N", help="Local cluster: worker processes (default: one per core, at most one per "
                                   "checkpoint to do; at most 4 per core).")]
ThreadsOpt = Annotated[int | None, typer.Option(
    "--threads", metavar="N",
    help="torch threads per checkpoint (default: the cores shared among the workers; at most 1024).")]
RecordFormatOpt = Annotated[RecordFormat | None, typer.Option(
    "--format", "-f", show_default=False, metavar="FORMAT",
    help="Output format; default: from -o's extension (.parquet too), else table on a terminal and json in a pipe.")]


def engine_format(command: str, fmt: RecordFormat | None, output: Path | None) -> str:
    """What the CLI itself refuses of an engine command before any work (the library checks the rest, in the CLI's
    names): Dask missing, an output that cannot be written. Returns the format to write."""
    if importlib.util.find_spec("distributed") is None:
        raise InputError(f"{command} needs Dask distributed: pip install 'qkinspect[sweep]'")
    return check_sweep_output(fmt, output)


def check_sweep_output(fmt: RecordFormat | None, output: Path | None) -> str:
    """The format to write, refused (before any work) when it cannot be: Parquet needs -o FILE and pyarrow."""
    if check_parquet(fmt, output):
        return "parquet"
    check_output(fmt, output)
    from qkinspect.cli.output import choose_format

    return choose_format(fmt, output)


class ProgressLine:
    """One line on stderr per checkpoint finished: done/total, failures, elapsed, ETA (`label`: the command)."""

    def __init__(self, label: str = "sweep"):
        self.label = label

    def __call__(self, s) -> None:
        eta = "?" if s.eta is None else _duration(s.eta)
        print(f"{self.label}: {s.done}/{s.total} done, {s.failed} failed, {_duration(s.elapsed)} elapsed, ETA {eta}"
              f"  ({s.last})", file=sys.stderr, flush=True)


def _duration(seconds: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(max(0.0, seconds)))


def write_table(doc: Document, name: str, output: Path | None) -> None:
    if name != "parquet":
        emit(doc, name, output)
        return
    write_parquet(doc.rows, output)
