"""Running the analysis for a command: selection checked against the model, a progress bar on stderr,
the library's warnings on stderr, and head-level sorting/trimming shared by `analyze`, `compare`, `plot`, `report`.

Example:
    >>> from qkinspect.cli.options import Selection
    >>> result = run_analysis("path/to/bert", Selection.parse(layers="0-1"))
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from qkinspect.cli.options import Selection, check_selection
from qkinspect.cli.output import progress, warn
from qkinspect.errors import InputError


def model_info(model: str | None, revision: str | None = None):
    """Open a model only to read its identity and shapes (config and headers; no weights)."""
    from qkinspect.loading import open_model

    with open_model(model, revision=revision) as m:
        return m.info


def run_analysis(model: str | None, selection: Selection, *, revision: str | None = None, info=None, **options: Any):
    """`qkinspect.analyze` with the CLI's selection; `options` pass through (layer_form, spectra, ...).

    Refuses a selection the model does not have before any work; warnings go to stderr.
    """
    import qkinspect

    info = info if info is not None else model_info(model, revision)
    kwargs = selection.kwargs()
    kwargs["blocks"] = check_selection(info, selection.blocks, selection.layers, selection.heads)
    if revision is not None:
        options["revision"] = revision
    with progress("analysing heads") as p:
        result = qkinspect.analyze(model, progress=p, **kwargs, **options)
    for w in result.warnings:
        warn(w)
    if not result.heads:
        raise InputError("the selection matched no heads")
    return result


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
