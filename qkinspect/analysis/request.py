"""What an analysis is asked to do, checked once, before any model is opened: the metrics, the selection (blocks,
layers, heads), the spectra to keep, the precision, the device, the folds and the layer form. Torch-free (the
device's check loads torch only for a GPU), so that a bad value is refused at once; then, from the model's
description alone (`check_model`: no weight is read), the selection and the q/k-norm fold.

Errors name each option as the caller spells it (`qkinspect.names.Names`): the library's argument names by default
(`layers='x'`, `precision='float16'`), the CLI's options when the CLI passes `CLI_NAMES` (`--layers: 'x' ...`).
Every command that runs an analysis (analyze, compare, spectrum, plot, report, sweep) checks its options here, so
one `--layers` value is parsed once, before the model opens, and checked against the model once, after.

Example:
    >>> r = check_request(layers="0-1", metrics=["symmetry"], precision="float64")
    >>> r.layers, r.precision
    ((0, 1), 'float64')
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qkinspect.device import requested_device
from qkinspect.errors import InputError
from qkinspect.metrics.registry import METRICS, check_spectra, head_metric, resolve_metrics
from qkinspect.names import Names
from qkinspect.processing import checked_precision
from qkinspect.selection import blocks_as_given, check_fold_qk_norm, check_selection, indexes_as_given

if TYPE_CHECKING:
    from qkinspect.layer import BlockSpec, ModelInfo

LIBRARY_NAMES = Names()
CLI_NAMES = Names.cli(blocks="--block")
# `qkinspect spectrum` names its one layer and head --layer and --head
SPECTRUM_CLI_NAMES = Names.cli(blocks="--block", layers="--layer", heads="--head")


def _cli(names: Names, option: str) -> bool:
    return getattr(names, option).startswith("--")


@dataclass(frozen=True)
class AnalysisRequest:
    """An analysis's settings, checked: the metric names in registry order (`requested`: as the caller gave them,
    None for the defaults), the spectra kept per head, the precision's name (one of PRECISIONS), the device's name,
    the folds, the layer form, the selection (the blocks as given, the layers and heads as sorted indexes; None:
    all), `layer`, the one layer a figure shows (`plot --kind heads --layer`; checked against the model with the
    selection), and how errors name the options (`names`)."""

    metrics: tuple[str, ...]
    spectra: tuple[str, ...]
    precision: str
    device: str
    fold_ln: bool
    fold_qk_norm: bool
    blocks: Any = None
    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None
    layer_form: bool = False
    requested: tuple[str, ...] | None = None
    layer: int | None = None
    names: Names = LIBRARY_NAMES

    def describe(self) -> str:
        """The chosen blocks, layers and heads as the caller named them ("--layers 0,1 --heads 3", "layers=0,1"),
        or "everything"."""
        given = (("blocks", self.blocks), ("layers", self.layers), ("heads", self.heads))
        parts = [f"{getattr(self.names, k)}{' ' if _cli(self.names, k) else '='}{','.join(map(str, v))}"
                 for k, v in given if v]
        return " ".join(parts) or "everything"

    def options(self) -> dict[str, Any]:
        """The analysis's options as `analyze` takes them (a sweep sends them to its workers and keys its results
        by them), the device aside: the metrics as the caller asked for them."""
        return {"layers": self.layers, "heads": self.heads, "blocks": self.blocks, "metrics": self.requested,
                "precision": self.precision, "fold_ln": self.fold_ln, "fold_qk_norm": self.fold_qk_norm,
                "layer_form": self.layer_form}

    def check_sort(self, sort: str | None, top: int | None, by: str = "head") -> None:
        """InputError, before the (possibly long) analysis runs, for a `top` below 1 or a `sort` that is not among
        the `by` ("head" or "layer") metrics this request computes, in the caller's names (`--sort`, `sort=`)."""
        if top is not None and top < 1:
            raise InputError(f"{self.names.top}: {top} must be at least 1" if _cli(self.names, "top") else
                             f"top={top}: must be at least 1")
        if sort is None:
            return
        names = [n for n in self.metrics if METRICS[n].per == by]
        if sort not in names:
            shown = f"{self.names.sort}: {sort!r}" if _cli(self.names, "sort") else f"sort={sort!r}"
            raise InputError(f"{shown} is not among the {by} metrics computed: {', '.join(names)}")


def _requested(metrics: Iterable[str] | str | None, names: Names) -> tuple[str, ...] | str | None:
    """The metric names as the caller gave them: a CLI's comma-separated and/or repeated values split, duplicates
    removed (nothing in them refused, naming the option); a library's passed on as given."""
    if metrics is None or isinstance(metrics, str) or not _cli(names, "metrics"):
        return None if metrics is None else metrics if isinstance(metrics, str) else tuple(metrics)
    if not metrics:
        return None
    chosen = [n.strip() for v in metrics for n in v.split(",") if n.strip()]
    if not chosen:
        raise InputError(f"{names.metrics}: no names given (leave the option out for the default)")
    return tuple(dict.fromkeys(chosen))


def check_request(metrics: Iterable[str] | str | None = None, spectra: Iterable[str] | None = ("qk",),
                  precision: str = "float32", device: str = "cpu", fold_ln: bool = False, fold_qk_norm: bool = False,
                  layer_form: bool = False, names: Names = LIBRARY_NAMES, *, layers: Any = None, heads: Any = None,
                  blocks: Any = None, layer: int | None = None) -> AnalysisRequest:
    """The request, checked whole before any model is opened, in the caller's option names (`names`).

    Raises:
        InputError: the first option refused, in this order: an unknown metric, a selection that is not indexes
            ("0-3,7", 3, [0, 1]), no block named, an unknown precision or spectrum, a device that is not there.

    Example:
        >>> check_request(precision="float64").precision
        'float64'
    """
    requested = _requested(metrics, names)
    resolved = resolve_metrics(requested, layer_form=layer_form)
    layers = indexes_as_given(layers, names.layers)
    heads = indexes_as_given(heads, names.heads)
    blocks = blocks_as_given(blocks or None, names.blocks)
    precision = checked_precision(precision, names)
    spectra = check_spectra(spectra or ())
    device = requested_device(device, names.device)
    if isinstance(requested, str):  # the library's "symmetry,overlap": recorded as the names it holds
        requested = tuple(n.strip() for n in requested.split(","))
    return AnalysisRequest(resolved, spectra, precision, device, bool(fold_ln), bool(fold_qk_norm), blocks, layers,
                           heads, bool(layer_form), requested, layer, names)


def check_selection_of(request: AnalysisRequest, info: ModelInfo) -> list[BlockSpec]:
    """The blocks the request selects, its blocks, layers, heads (and a figure's one `layer`, first) checked against
    the model's description, each refused in the option the caller gave."""
    names = request.names
    if request.layer is not None:
        check_selection(info, request.blocks, (request.layer,), options=(names.blocks, names.layer, names.heads))
    return check_selection(info, request.blocks, request.layers, request.heads,
                           options=(names.blocks, names.layers, names.heads))


def measured_blocks(request: AnalysisRequest, chosen: Sequence[BlockSpec]) -> list[BlockSpec]:
    """Of the `chosen` blocks, those with a selected head, the q/k-norm fold checked on them (refused when none
    has q/k norms)."""
    kept = [b for b in chosen if request.heads is None or any(h < b.n_heads for h in request.heads)]
    flag = request.names.fold_qk_norm
    check_fold_qk_norm(kept, request.fold_qk_norm, flag if flag.startswith("--") else f"{flag}=True")
    return kept


def check_model(request: AnalysisRequest, info: ModelInfo) -> list[BlockSpec]:
    """The blocks to measure: the selection checked against the model's description, then the q/k-norm fold on
    the blocks with a selected head (`check_selection_of`, `measured_blocks`); no weight is read."""
    return measured_blocks(request, check_selection_of(request, info))


def check_head_metric(name: str, names: Names = LIBRARY_NAMES) -> str:
    """`name` when it is a per-head metric (a figure maps one: `plot --kind metric --metric NAME`), else InputError
    naming the option as the caller spells it (`--metric 'x'`, `metric 'x'`) and listing those that are."""
    return head_metric(name, names.metric).name
