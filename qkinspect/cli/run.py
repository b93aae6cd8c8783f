"""What the commands that run an analysis (analyze, compare, spectrum, plot, report) share around their one library
call: a progress bar on stderr, the library's warnings and notes on stderr, the refusal of a selection that matched
no heads, and head-level sorting/trimming. The options are checked in the library, once, in the CLI's names
(`qkinspect.analysis.request.CLI_NAMES`).

Example:
    >>> from qkinspect.analysis.request import CLI_NAMES, check_request
    >>> result = run_analysis("path/to/bert", check_request(layers="0-1", names=CLI_NAMES))  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from qkinspect.cli.output import note, progress, warn
from qkinspect.errors import InputError


def run_analysis(model, request, *, revision: str | None = None):
    """`qkinspect.analyze` of `model` for the checked `request`, with a progress bar; its warnings and notes on
    stderr; InputError when the selection matched no heads."""
    from qkinspect.analysis.run import analyze  # torch: only once the request is checked

    return shown(lambda p: analyze(model, request=request, revision=revision, progress=p), request)


def shown(analysis: Callable[[Any], Any], request=None, label: str = "analysing heads"):
    """The result of `analysis(progress)` (an AnalysisResult) run under a progress bar, its warnings and notes
    written on stderr; InputError naming the selection (`request.describe()`) when it matched no heads."""
    with progress(label) as p:
        result = analysis(p)
    tell(result, request)
    return result


def tell(result, request=None) -> None:
    """An analysis's warnings and notes on stderr; InputError when the selection (`request.describe()`, where
    given) matched no heads."""
    for w in result.warnings:
        warn(w)
    for line in result.notes():  # information, asking nothing: one note each (JSON: processing)
        note(line)
    if not result.heads:
        asked = "" if request is None else f" ({request.describe()})"
        raise InputError(f"{result.model.name}: the selection{asked} matched no heads of this model")


def sort_key(metric: str, ascending: bool):
    """Sort rows by `metric`, NaN and missing values last whatever the direction."""

    def key(values) -> tuple[int, float]:
        v = values.get(metric)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return (1, 0.0)
        return (0, float(v) if ascending else -float(v))

    return key


def sort_and_trim(result, *, sort: str | None, top: int | None, by: str = "head", ascending: bool = False):
    """A copy of `result` whose head (or layer) records are sorted by `sort` and cut to the first `top`."""
    if top is not None and top < 1:
        raise InputError(f"--top: {top} must be at least 1")
    field = "heads" if by == "head" else "layers"
    records = list(getattr(result, field))
    if sort is not None:
        known = sorted({k for r in records for k in r.values})
        if sort not in known:
            raise InputError(f"--sort: {sort!r} is not among the {by} metrics computed: {', '.join(known)}")
        records.sort(key=lambda r: sort_key(sort, ascending)(r.values))
    if top is not None:
        records = records[:top]
    return dataclasses.replace(result, **{field: records})
