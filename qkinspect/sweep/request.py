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
from typing import TYPE_CHECKING, Any

from qkinspect.errors import InputError
from qkinspect.names import Names
from qkinspect.sweep.names import LIBRARY_NAMES

if TYPE_CHECKING:
    from qkinspect.analysis.request import AnalysisRequest

__all__ = ["SweepRequest", "check_engine", "check_request"]


@dataclass(frozen=True)
class SweepRequest:
    """A checked sweep request: the folder, the analysis options as the engine keys its results by them
    (`qkinspect.sweep.keys.normalized_options`: every name present, the selection as indexes), the device, the
    engine's options, how later errors (the folder, the scheduler's answer) name them (`names`), and the analysis's
    own request (`analysis`: what each checkpoint's description is checked against, `check_model`; None for the
    atlas's, whose models differ in shape)."""

    out: Path
    options: dict[str, Any]
    device: str = "cpu"
    scheduler: str | None = None
    workers: int | None = None
    threads: int | None = None
    names: Names = LIBRARY_NAMES
    analysis: AnalysisRequest | None = None


def check_request(out: str | Path, options: dict[str, Any] | None = None, *, scheduler: str | None = None,
                  workers: int | None = None, threads: int | None = None, device: str = "cpu",
                  names: Names = LIBRARY_NAMES) -> SweepRequest:
    """The sweep request, checked whole before any work, in the caller's option names (`names`): the engine's
    options first, then the analysis's (`qkinspect.analysis.request.check_request`). `options`: the analysis's
    (layers, heads, blocks, metrics, precision, fold_ln, fold_qk_norm, layer_form), as `qkinspect.analyze` takes
    them, or as the CLI's options give them with the CLI's names.

    Raises:
        InputError: threads or workers out of range, a scheduler address that is not one, an option the analysis
            does not take, an unknown metric, a selection that is not indexes ("0-3,7", 3, [0, 1]), an unknown
            precision, a device that is not there.
    """
    from qkinspect.analysis.request import check_request as check_analysis
    from qkinspect.sweep.keys import OPTION_NAMES, OPTIONAL_NAMES, normalized_options

    check_engine(scheduler, workers, threads, names)
    given = dict(options or {})
    unknown = set(given) - set(OPTION_NAMES) - set(OPTIONAL_NAMES)
    if unknown:
        raise InputError(f"sweep: unknown analysis options {', '.join(sorted(unknown))}")
    analysis = check_analysis(given.get("metrics"), spectra=None, precision=given.get("precision", "float32"),
                              device=device, fold_ln=given.get("fold_ln", False),
                              fold_qk_norm=given.get("fold_qk_norm", False),
                              layer_form=given.get("layer_form", False), names=names, layers=given.get("layers"),
                              heads=given.get("heads"), blocks=given.get("blocks"))
    metrics = given.get("metrics")  # a library's "a,b" is keyed as given (as sweeps before the request were)
    options = normalized_options({**given, **analysis.options(),
                                  **({"metrics": metrics} if isinstance(metrics, str) else {})})
    return SweepRequest(Path(out), options, analysis.device, scheduler, workers, threads, names, analysis)


def check_engine(scheduler: str | None, workers: int | None, threads: int | None, names: Names) -> None:
    """The engine's options (the sweep's and the atlas's): thread and worker counts in range, a scheduler address
    that is one (the engine connects to it as given); InputError in the caller's names otherwise."""
    from qkinspect.limits import check_threads, check_workers

    check_threads(threads, names.threads)
    check_workers(workers, names.workers)
    if scheduler is not None:
        from qkinspect.sweep.scheduler import check_address

        check_address(scheduler, names.scheduler)
