"""What an analysis is asked to do, checked once, before any model is opened: the metrics, the spectra to keep, the
precision, the device and the folds. Torch-free at import (the device's check loads torch only when it is called),
so that a bad value is refused at once.

Errors name each option as the caller spells it (`qkinspect.names.Names`): the library's argument names by default
(`precision='float16'`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from qkinspect.device import check_device
from qkinspect.metrics.registry import check_spectra, resolve_metrics
from qkinspect.names import Names
from qkinspect.processing import checked_precision

LIBRARY_NAMES = Names()


@dataclass(frozen=True)
class AnalysisRequest:
    """An analysis's settings, checked: the metric names in registry order, the spectra kept per head, the
    precision's name (one of PRECISIONS), the device's name and the folds."""

    metrics: tuple[str, ...]
    spectra: tuple[str, ...]
    precision: str
    device: str
    fold_ln: bool
    fold_qk_norm: bool


def check_request(metrics: Iterable[str] | None = None, spectra: Iterable[str] | None = ("qk",),
                  precision: str = "float32", device: str = "cpu", fold_ln: bool = False, fold_qk_norm: bool = False,
                  layer_form: bool = False, names: Names = LIBRARY_NAMES) -> AnalysisRequest:
    """The request, or InputError naming the first option refused (as `names` spells it): an unknown precision,
    metric, spectrum or device.

    Example:
        >>> check_request(precision="float64").precision
        'float64'
    """
    precision = checked_precision(precision, names)
    return AnalysisRequest(resolve_metrics(metrics, layer_form=layer_form), check_spectra(spectra or ()), precision,
                           check_device(device, names.device), bool(fold_ln), bool(fold_qk_norm))
