"""What an atlas is asked to do, checked once, before torch is imported or any model is looked for: the analysis
options (metrics, precision, fold_ln, fold_qk_norm; the layer form always on), the device and the engine's options
(scheduler, workers, threads).

Errors name each option as the caller spells it (`qkinspect.names.Names`): the library's argument names by default
(`workers=0`), the CLI's options when the CLI passes `qkinspect.sweep.names.CLI_NAMES` (`--workers 0`).

Example:
    >>> check_request("atlas/", metrics="symmetry", workers=2).options["layer_form"]
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qkinspect.errors import InputError
from qkinspect.names import Names
from qkinspect.sweep.names import LIBRARY_NAMES
from qkinspect.sweep.request import SweepRequest, check_engine

__all__ = ["OPTION_NAMES", "AtlasRequest", "atlas_options", "check_request"]

OPTION_NAMES = ("metrics", "precision", "fold_ln", "fold_qk_norm", "behaviour")


@dataclass(frozen=True)
class AtlasRequest(SweepRequest):
    """A checked atlas request: a sweep's request (the atlas runs on the sweep's engine) whose options are the
    atlas's: the folder, the analysis options as the engine takes them (layer form on, the behaviour settings where
    asked), the device and the engine's options; `names`: how later errors (the folder, the scheduler's answer) name
    them."""


def atlas_options(options: dict[str, Any]) -> dict[str, Any]:
    """The analysis options of an atlas (metrics, precision, fold_ln, fold_qk_norm) as the sweep takes them, layer
    form on; InputError for an unknown option, metric or precision, before any work. `fold_qk_norm` folds the q/k
    norm gains of each model that has them (qkinspect.sweep.task); the others are measured as stored."""
    from qkinspect.metrics.registry import resolve_metrics
    from qkinspect.processing import PRECISIONS
    from qkinspect.sweep.keys import normalized_options

    unknown = set(options) - set(OPTION_NAMES)
    if unknown:
        raise InputError(f"atlas: unknown options {', '.join(sorted(unknown))}; it takes {', '.join(OPTION_NAMES)}")
    metrics = options.get("metrics")
    if isinstance(metrics, str):
        metrics = [m for m in metrics.split(",") if m.strip()]
    resolve_metrics(metrics)
    precision = str(options.get("precision") or "float32")
    if precision not in PRECISIONS:
        raise InputError(f"precision={precision!r}: choose float32 or float64")
    # behaviour: the heads' settings (qkinspect.atlas.behaviour.settings), stored only when asked for, so that an
    # atlas without it keeps its keys and files as they were
    return normalized_options({"metrics": list(metrics) if metrics is not None else None, "precision": precision,
                               "fold_ln": bool(options.get("fold_ln", False)),
                               "fold_qk_norm": bool(options.get("fold_qk_norm", False)), "layer_form": True,
                               "behaviour": options.get("behaviour") or None})


def check_request(out: str | Path, *, metrics: list[str] | tuple[str, ...] | str | None = None,
                  precision: str = "float32", fold_ln: bool = False, fold_qk_norm: bool = False,
                  device: str = "cpu", scheduler: str | None = None, workers: int | None = None,
                  threads: int | None = None, behaviour: bool | dict[str, Any] = False, sequences: int | None = None,
                  length: int | None = None, seed: int | None = None,
                  names: Names = LIBRARY_NAMES) -> AtlasRequest:
    """The atlas request, checked whole before any work, in the caller's option names (`names`). `behaviour`:
    run `heads` in each model's task, with `sequences`, `length`, `seed` (None: the atlas's small defaults,
    qkinspect.atlas.behaviour; a dict: settings as an atlas stored them).

    Raises:
        InputError: threads or workers out of range, a scheduler address that is not one, an unknown metric or
            precision, a device that is not there; sequences, length or seed out of range, or given without
            behaviour.
    """
    check_engine(scheduler, workers, threads, names)
    if metrics is not None and not isinstance(metrics, str):
        metrics = list(dict.fromkeys(n.strip() for m in metrics for n in str(m).split(",") if n.strip()))
        if not metrics:
            raise InputError(f"{names.metrics}: no names given (leave the option out for the default)")
    amounts = {k: v for k, v in (("sequences", sequences), ("length", length), ("seed", seed)) if v is not None}
    if amounts and not behaviour:
        first = next(iter(amounts))
        raise InputError(f"{names.said(first, amounts[first])}: an amount of the behaviour scores; give "
                         f"{names.behaviour} too")
    if behaviour:
        from qkinspect.atlas.behaviour import settings

        if isinstance(behaviour, dict):  # as an atlas stored them: its amounts, asked again
            amounts = {k: behaviour[k] for k in ("sequences", "length", "seed") if k in behaviour} | amounts
        behaviour = settings(**amounts, metrics=None if metrics is None else (
            [m for m in metrics.split(",") if m.strip()] if isinstance(metrics, str) else metrics), names=names)
    options = atlas_options({"metrics": metrics, "precision": precision, "fold_ln": fold_ln,
                             "fold_qk_norm": fold_qk_norm, "behaviour": behaviour or None})
    if device != "cpu":
        from qkinspect.device import check_device

        device = check_device(device, names.device)
    return AtlasRequest(Path(out), options, device, scheduler, workers, threads, names)
