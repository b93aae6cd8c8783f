"""The sweep's engine: Dask distributed runs one task per checkpoint; this module only plans, submits, writes each
result as it arrives, and resumes.

- Without a scheduler address, a `LocalCluster` on this machine: `workers` processes (default: one per core, no more
  than there are checkpoints to do), each running one task at a time with `cores // workers` torch threads.
- With `scheduler="tcp://host:8786"`, an existing cluster (`dask scheduler` + `dask worker`, dask-jobqueue,
  Kubernetes) whose workers can read the checkpoints.
- A checkpoint whose result file is already in the folder is skipped. A task that raises is retried once by Dask
  (`retries=1`); a worker that dies takes its tasks with it and the scheduler runs them elsewhere. What still fails is
  recorded and the rest go on. Ctrl-C (KeyboardInterrupt) cancels what is pending and keeps what is written.

Example:
    >>> from qkinspect.sweep import discover, run_sweep
    >>> outcome = run_sweep(discover(["runs/*/checkpoint-*"]), {"metrics": ["symmetry"]}, "sweep-out")  # doctest: +SKIP
    >>> outcome.failures  # doctest: +SKIP
    []
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qkinspect import limits
from qkinspect.documents import model_info
from qkinspect.errors import InputError, QkinspectError
from qkinspect.layer import ModelInfo, shape_differences
from qkinspect.names import Names
from qkinspect.sweep import keys, store, task
from qkinspect.sweep.checkpoints import Checkpoint
from qkinspect.sweep.keys import Failure
from qkinspect.sweep.names import LIBRARY_NAMES
from qkinspect.sweep.request import SweepRequest, check_request

CONNECT_TIMEOUT = "20s"
# The local cluster's workers keep glibc's malloc as every other process has it. Dask's nanny sets
# MALLOC_TRIM_THRESHOLD_=65536 in its workers by default (`distributed.nanny.pre-spawn-environ`); setting any M_TRIM
# threshold turns off glibc's dynamic mmap threshold, so every tensor over 128 KiB is a fresh mmap, page-faulted and
# zeroed again at each allocation: a twin's training step was 2.3x slower in such a worker than in this process
# (docs/twin.md, "Stacked training"). Memory the workers free is handed back by `heal.return_freed_memory` where
# it matters.
PRE_SPAWN = "distributed.nanny.pre-spawn-environ"


@dataclass(frozen=True)
class Status:
    """Where a sweep stands, after each checkpoint: done (including skipped) of total, failures, seconds since
    the work began, and the estimated seconds left (the mean time per checkpoint so far, times those left)."""

    done: int
    total: int
    failed: int
    skipped: int
    elapsed: float
    eta: float
    last: str | None = None


@dataclass
class Outcome:
    """What a sweep did: checkpoints computed now, skipped (already in the folder), and failed; and the result
    files found in the folder but refused (sweep.verify), whose checkpoints were computed again."""

    folder: Path
    checkpoints: list[Checkpoint]
    computed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # result files found but not trusted (computed again): why

    def read(self) -> store.SweepResult:
        return store.read_sweep(self.folder)


def run_sweep(checkpoints: list[Checkpoint], options: dict[str, Any], folder: str | Path, *,
              scheduler: str | None = None, workers: int | None = None, threads: int | None = None,
              device: str = "cpu", progress: Callable[[Status], None] | None = None,
              check: Callable[[ModelInfo], None] | None = None,
              notice: Callable[[str], None] | None = None, same_shapes: bool = True,
              names: Names = LIBRARY_NAMES, extend: Callable[..., dict[str, Any]] | None = None) -> Outcome:
    """Analyse every checkpoint with `options` (as `qkinspect.analyze` takes them), one result file each in `folder`:
    the request checked (`qkinspect.sweep.request.check_request`), then `run`.

    Args:
        checkpoints: from `discover`.
        options: layers, heads, blocks, metrics, precision, fold_ln, fold_qk_norm, layer_form.
        folder: the sweep folder (created); results already there for these options are reused.
        scheduler: a Dask scheduler address; None starts a LocalCluster.
        workers: LocalCluster worker processes (default: the cores, at most the checkpoints to do).
        threads: torch threads per task (default: the cores shared among the tasks that run at once).
        progress: called with a Status after each checkpoint.
        check: called with the first checkpoint's ModelInfo before any analysis (e.g. to refuse a selection).
        notice: called, before any work, with why each result file found in the folder was refused (it is
            computed again); the reasons are also in `Outcome.refused`.
        same_shapes: refuse checkpoints whose attention shapes differ (a sweep); False for models of any shape
            (the atlas, qkinspect.atlas).
        names: how errors name the options (`qkinspect.sweep.names`): these arguments' names by default; the CLI
            passes its own.
        extend: what adds to each checkpoint's analysis in its task, where the options ask for it (the atlas's
            behaviour scores: qkinspect.atlas.behaviour.join); the engine itself runs `analyze` only.

    Raises:
        InputError: a bad option (`check_request`, before anything else), the checkpoints' attention shapes differ
            (with `same_shapes`, before any analysis), the scheduler cannot be reached, or `check` refuses.
            KeyboardInterrupt after cancelling the pending tasks.
    """
    request = check_request(folder, options, scheduler=scheduler, workers=workers, threads=threads, device=device,
                            names=names)
    return run(request, checkpoints, progress=progress, check=check, notice=notice, same_shapes=same_shapes,
               extend=extend)


def run(request: SweepRequest, checkpoints: list[Checkpoint], *, progress: Callable[[Status], None] | None = None,
        check: Callable[[ModelInfo], None] | None = None, notice: Callable[[str], None] | None = None,
        same_shapes: bool = True, extend: Callable[..., dict[str, Any]] | None = None) -> Outcome:
    """Analyse every checkpoint as `request` (from `check_request`) asks; the other arguments as `run_sweep`'s."""
    folder, options, device, names = request.out, request.options, request.device, request.names
    store.check_folder(folder)  # created once the checkpoints pass the checks
    plan = [(ck, key, store.result_path(folder, ck, key)) for ck in checkpoints
            for key in [keys.result_key(ck, options)]]
    stored, refused = _stored(folder, plan, options)
    for why in refused if notice is not None else ():
        notice(why)
    todo = [p for p in plan if p[0].identity not in stored]
    outcome = Outcome(folder, checkpoints, skipped=[ck.name for ck, _, _ in plan if ck.identity in stored],
                      refused=refused)
    infos = {identity: model_info(doc["result"]["model"]) for identity, doc in stored.items()}
    if not todo:
        _check_before_work(checkpoints, infos, check, same_shapes)
    else:
        with connect(request.scheduler, request.workers, request.threads, len(todo),
                     names) as (client, task_threads):
            models = _describe(client, todo, outcome.failures)
            _check_before_work(checkpoints, {**infos, **models}, check, same_shapes)
            store.prepare(folder)
            store.write_manifest(folder, checkpoints, options)  # what an interrupted sweep leaves to read
            runnable = [p for p in todo if p[0].identity in models]
            _analyze(client, runnable, options, device, task_threads, outcome, progress, extend)
    store.write_manifest(folder, checkpoints, options, outcome.failures)
    return outcome


def _stored(folder: Path, plan, options) -> tuple[dict[str, dict], list[str]]:
    """The results already in the folder that can be trusted (store.load_result), by checkpoint identity, and why
    each file there that cannot was refused (those checkpoints are computed again)."""
    stored, refused = {}, []
    for ck, key, _ in plan:
        try:
            doc = store.load_result(folder, ck, key, options)
        except InputError as e:
            refused.append(str(e))
            continue
        if doc is not None:
            stored[ck.identity] = doc
    return stored, refused


@contextlib.contextmanager
def connect(scheduler: str | None, workers: int | None, threads: int | None,
            n_tasks: int, names: Names = LIBRARY_NAMES) -> Iterator[tuple[Any, int | None]]:
    """A Dask client (to `scheduler`, or to a new LocalCluster) and the torch threads each task should use.
    `workers` and `threads` come checked (`check_threads`, `check_workers`: the sweep's request, `check_engine`, and
    the twin's check them once, in the caller's names, before any work)."""
    import dask
    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.ERROR)  # the CLI reports failures itself, once
    if scheduler is not None:
        if workers is not None:
            raise InputError(f"{names.workers} sizes the local cluster; with {names.scheduler} the cluster's own "
                             "workers run")
        from qkinspect.sweep.scheduler import check_address, probe, security

        address = check_address(scheduler, names.scheduler)
        probe(address, option=names.scheduler)  # a Dask scheduler answers, in bounded time; else refused here
        extra = {"security": security(address, names.scheduler)} if address.startswith("tls://") else {}
        try:
            client = Client(address, timeout=CONNECT_TIMEOUT, **extra)
        except Exception as e:  # noqa: BLE001 - whatever the peer provokes in Dask's client is one line
            raise InputError(f"{names.said('scheduler', address)}: cannot connect ({type(e).__name__}: {e})") from None
        with contextlib.closing(client):
            yield client, threads
        return
    cores = limits.cores()
    n = workers or max(1, min(cores, n_tasks))
    with _workers_deaf_to_ctrl_c():
        # The scheduler always serves HTTP (health, metrics); a free port on loopback, not 8787 (maybe taken).
        # The workers' own logs stay quiet even at ERROR: a task's failure reaches the client as its exception
        # (listed once by the CLI), and what they log besides is shutdown noise (a heartbeat that meets the
        # closing scheduler: CommClosedError), which is not the user's to read.
        with dask.config.set({PRE_SPAWN + ".MALLOC_TRIM_THRESHOLD_": None}):  # glibc's own malloc (WORKER_MALLOC)
            cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                                   dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL)
    with contextlib.closing(cluster), contextlib.closing(Client(cluster)) as client:
        yield client, threads or max(1, cores // n)


@contextlib.contextmanager
def _workers_deaf_to_ctrl_c() -> Iterator[None]:
    """Start the local workers with SIGINT ignored (a disposition child processes inherit): Ctrl-C in the terminal
    reaches the whole process group, and only this process should act on it, by cancelling and closing the cluster.
    A Ctrl-C while the workers start is ignored with them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _check_before_work(checkpoints: list[Checkpoint], infos: dict[str, ModelInfo], check,
                       same_shapes: bool = True) -> None:
    """Shapes alike across every checkpoint that could be opened (in sweep order) when `same_shapes`, then the
    caller's own check."""
    known = [(ck, infos[ck.identity]) for ck in checkpoints if ck.identity in infos]
    if same_shapes:
        check_shapes(known)
    if check is not None and known:
        check(known[0][1])


def check_shapes(infos: list[tuple[Checkpoint, ModelInfo]]) -> None:
    """InputError naming every checkpoint whose attention shapes differ from the first one's."""
    if not infos:
        return
    (ck0, first), rest = infos[0], infos[1:]
    diffs = [f"{ck.name} ({'; '.join(d)})" for ck, info in rest if (d := shape_differences(first, info))]
    if diffs:
        raise InputError(f"cannot sweep: attention shapes differ from {ck0.name}'s: {', '.join(diffs)}")


def _describe(client, todo, failures: list[Failure]) -> dict[str, ModelInfo]:
    """Each checkpoint's shapes, read on the workers (they are the ones that must read the checkpoints)."""
    from distributed import as_completed

    futures = {client.submit(task.describe, ck.spec, ck.revision, key=_task_key("describe", key), retries=1,
                             pure=False): ck for ck, key, _ in todo}
    models = {}
    with cancelling(client, futures):
        for fut in as_completed(futures):
            ck = futures[fut]
            if fut.status == "finished":
                models[ck.identity] = model_info(fut.result())
            else:
                failures.append(Failure(ck.name, error_text(fut)))
            fut.release()
    return models


def _analyze(client, todo, options, device, threads, outcome: Outcome, progress, extend=None) -> None:
    from distributed import as_completed

    futures = {client.submit(task.analyze_checkpoint, ck.spec, ck.revision, options, device=device, threads=threads,
                             extend=extend,
                             key=_task_key("analyze", key), retries=1, pure=False): (ck, key, path)
               for ck, key, path in todo}
    total, skipped, t0 = len(outcome.checkpoints), len(outcome.skipped), time.monotonic()
    unopened = len(outcome.failures)  # checkpoints that could not be opened are done with
    with cancelling(client, futures):
        for n, fut in enumerate(as_completed(futures), start=1):
            ck, key, path = futures[fut]
            if fut.status == "finished":
                store.write_json(path, store.result_document(ck, key, options, fut.result(), device))
                outcome.computed.append(ck.name)
            else:
                outcome.failures.append(Failure(ck.name, error_text(fut)))
            fut.release()
            if progress is not None:
                elapsed = time.monotonic() - t0
                eta = elapsed / n * (len(todo) - n)
                progress(Status(skipped + unopened + n, total, len(outcome.failures), skipped, elapsed, eta, ck.name))


@contextlib.contextmanager
def cancelling(client, futures) -> Iterator[None]:
    """On the way out (Ctrl-C included), cancel the tasks not finished, so the cluster stops working for us."""
    try:
        yield
    finally:
        pending = [f for f in futures if not f.done()]
        if pending:
            with contextlib.suppress(Exception):
                client.cancel(pending, force=True)


def _task_key(kind: str, key: str) -> str:
    # Unique per submission: a resumed sweep must not meet the cancelled task of the one interrupted.
    return f"qkinspect-{kind}-{key}-{uuid.uuid4().hex[:8]}"


def error_text(fut) -> str:
    try:
        e = fut.exception()
    except BaseException as exc:  # a cancelled future raises here
        return f"{type(exc).__name__}: {exc}".rstrip(": ")
    if isinstance(e, QkinspectError):
        return " ".join(str(e).split())
    return " ".join(f"{type(e).__name__}: {e}".split())
