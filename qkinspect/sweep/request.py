"""What a sweep is asked to do, checked once, before any checkpoint is looked at, Dask is started or the folder is
created: the engine's options (threads, workers, scheduler), the analysis options every checkpoint is measured with
(the selection, metrics, precision, folds, layer form: as `qkinspect.analyze` takes them) and the device.

Errors name each option as the caller spells it (`qkinspect.names.Names`): the library's argument names by default
(`workers=0`), the CLI's options when the CLI passes `qkinspect.sweep.names.CLI_NAMES` (`--workers 0`). What only a
checkpoint's description can refuse (a layer past the model's, shapes that differ) is refused by the engine once the
first checkpoints are described, still before any analysis (`run_sweep(check=...)`).

Example:
    >>> check_request("sweep-out", {"layers": "0-1", "metrics": ["symmetry"]}, workers=2).options["layers"]
    [0, 1]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qkinspect.errors import InputError
from qkinspect.names import Names
from qkinspect.sweep.names import LIBRARY_NAMES

__all__ = ["SweepRequest", "check_engine", "check_request"]


@dataclass(frozen=True)
class SweepRequest:
    """A checked sweep request: the folder, the analysis options as the engine keys its results by them
    (`qkinspect.sweep.keys.normalized_options`: every name present, the selection as indexes), the device, the
    engine's options, and how later errors (the folder, the scheduler's answer) name them (`names`)."""

    out: Path
    options: dict[str, Any]
    device: str = "cpu"
    scheduler: str | None = None
    workers: int | None = None
    threads: int | None = None
    names: Names = LIBRARY_NAMES


def check_request(out: str | Path, options: dict[str, Any] | None = None, *, scheduler: str | None = None,
                  workers: int | None = None, threads: int | None = None, device: str = "cpu",
                  names: Names = LIBRARY_NAMES) -> SweepRequest:
    """The sweep request, checked whole before any work, in the caller's option names (`names`). `options`: the
    analysis's (layers, heads, blocks, metrics, precision, fold_ln, fold_qk_norm, layer_form; the atlas adds its
    behaviour settings), as `qkinspect.analyze` takes them.

    Raises:
        InputError: threads or workers out of range, a scheduler address that is not one, an option the analysis
            does not take, a selection that is not indexes ("0-3,7", 3, [0, 1]), an unknown metric or precision, a
            device that is not there.
    """
    from qkinspect.selection import indexes_as_given
    from qkinspect.sweep.keys import normalized_options

    check_engine(scheduler, workers, threads, names)
    options = dict(options or {})
    for name in ("layers", "heads"):  # text ("0-3,7") refused in the caller's words; the rest as analyze takes it
        if isinstance(options.get(name), str):
            indexes_as_given(options[name], getattr(names, name))
    options = normalized_options(options)
    _check_metrics(options["metrics"], options["layer_form"], names)
    from qkinspect.processing import checked_precision

    checked_precision(options["precision"], names)
    from qkinspect.device import requested_device

    return SweepRequest(Path(out), options, requested_device(device, names.device), scheduler, workers, threads,
                        names)


def check_engine(scheduler: str | None, workers: int | None, threads: int | None, names: Names) -> None:
    """The engine's options (the sweep's and the atlas's): thread and worker counts in range, a scheduler address
    that is one (the engine connects to it as given); InputError in the caller's names otherwise."""
    from qkinspect.limits import check_threads, check_workers

    check_threads(threads, names.threads)
    check_workers(workers, names.workers)
    if scheduler is not None:
        from qkinspect.sweep.scheduler import check_address

        check_address(scheduler, names.scheduler)


def _check_metrics(metrics: Any, layer_form: bool, names: Names) -> None:
    """Every metric or group name known (each checkpoint's analysis would refuse it, once per checkpoint)."""
    if metrics is None:
        return
    from qkinspect.metrics.registry import resolve_metrics

    given = [n for m in ([metrics] if isinstance(metrics, str) else metrics) for n in str(m).split(",") if n.strip()]
    try:
        resolve_metrics([n.strip() for n in given], layer_form=layer_form)
    except InputError as e:
        raise InputError(f"{names.metrics}: {e}") from None
