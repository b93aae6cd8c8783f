"""Bounds on the amounts a user or a file can ask for (threads, worker processes), checked before anything is
started: a value past them is refused with one line (exit 2) instead of exhausting the machine (docs/security.md).
"""

from __future__ import annotations

import os

from qkinspect.errors import InputError

MAX_THREADS = 1024  # torch threads per task (`analyze(threads=)`, `run_sweep(threads=)`)
MAX_METRIC = 1e30  # the largest value a saved metric may hold (norms of float32 weights stay far below): a file's
# larger numbers are refused where they enter, before statistics over them could overflow
WORKERS_PER_CORE = 4  # a local sweep cluster: at most this many worker processes per core (`run_sweep(workers=)`)


def cores() -> int:
    """The CPUs this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def check_threads(threads: int | None, option: str = "threads") -> None:
    """InputError unless `threads` is None or 1 .. MAX_THREADS; `option` names it as the caller does ("--threads"
    from the CLI)."""
    if threads is None:
        return
    if threads < 1:
        raise InputError(f"{option}: {threads} must be at least 1")
    if threads > MAX_THREADS:
        raise InputError(f"{option}: {threads} is more than the {MAX_THREADS} torch threads a task may use")


def check_workers(workers: int | None, option: str = "workers") -> None:
    """InputError unless `workers` is None or 1 .. WORKERS_PER_CORE × the cores (local worker processes); `option`
    names it as the caller does ("--workers" from the CLI)."""
    if workers is None:
        return
    if workers < 1:
        raise InputError(f"{option}: {workers} must be at least 1")
    most = WORKERS_PER_CORE * cores()
    if workers > most:
        raise InputError(f"{option}: {workers} is more than the {most} local worker processes this machine may "
                         f"run ({WORKERS_PER_CORE} per core, {cores()} cores)")
