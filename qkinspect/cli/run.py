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
from qkinspect.cli.output import note, progress, warn
from qkinspect.errors import InputError
from qkinspect.selection import check_fold_qk_norm


def run_analysis(model, selection: Selection, *, revision: str | None = None, **options: Any):
    """`qkinspect.analyze` with the CLI's selection; `options` pass through (layer_form, spectra, ...).

    `model` is a spec (opened here, once) or an already opened LoadedModel. A selection the model does not have is
    refused before any work; a progress bar shows on stderr for long runs; the library's warnings go to stderr.
    """
    from qkinspect.loading import LoadedModel, open_model

    if isinstance(model, LoadedModel):
        return _analyze_opened(model, selection, options)
    with open_model(model, revision=revision) as m:
        return _analyze_opened(m, selection, options)


def _analyze_opened(m, selection: Selection, options: dict[str, Any]):
    kwargs = selection.kwargs()
    kwargs["blocks"] = check_selection(m.info, selection.blocks, selection.layers, selection.heads)
    chosen = [b for b in m.info.blocks if kwargs["blocks"] is None or b.key in kwargs["blocks"]]
    check_fold_qk_norm(chosen, selection.fold_qk_norm, "--fold-qk-norm")
    from qkinspect import analysis  # torch: only once the selection is checked (the package analysis, not the face)

    with progress("analysing heads") as p:
        result = analysis.analyze(m, progress=p, **kwargs, **options)
    for w in result.warnings:
        warn(w)
    if result.processing.recomputed_float64:  # information, asking nothing: one note (JSON: processing)
        from qkinspect.metrics.heads import recompute_note

        p = result.processing
        note(recompute_note(p.recomputed_float64, len(result.heads), p.precision))
    if result.processing.qk_norm_not_folded:
        from qkinspect.terminal.tables import qk_norm_line

        note(qk_norm_line(result.processing.qk_norm_not_folded))
    if not result.heads:
        raise InputError(f"{m.info.name}: the selection ({selection.describe()}) matched no heads of this model")
    return result


def check_sort(sort: str | None, top: int | None, *, metrics: tuple[str, ...] | None, by: str = "head",
               layer_form: bool = False) -> None:
    """Refuse --sort/--top values that cannot apply, before the (possibly long) analysis runs."""
    from qkinspect.metrics.registry import METRICS, resolve_metrics

    if top is not None and top < 1:
        raise InputError(f"--top: {top} must be at least 1")
    if sort is None:
        return
    names = [n for n in resolve_metrics(metrics, layer_form=layer_form) if METRICS[n].per == by]
    if sort not in names:
        raise InputError(f"--sort: {sort!r} is not among the {by} metrics computed: {', '.join(names)}")


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
