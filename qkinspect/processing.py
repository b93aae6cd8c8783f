"""How weights are processed before they are measured, in one ground module for every capability: the precisions
a caller may ask for (`PRECISIONS`, by name: torch-free, so that a request is checked before torch loads) and the
`Processing` recorded with every analysis (folds, precision, device, selection, what was dequantized), and the
`CompositionProcessing` recorded with every composition (its kinds and its earlier and later selections).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qkinspect.errors import InputError

PRECISIONS = ("float32", "float64")  # the torch dtypes of these names; half precision is always cast up


def checked_precision(precision: Any, names: Any) -> str:
    """The precision's name (an enum's value too), or InputError in the caller's words (`names.said`)."""
    precision = str(getattr(precision, "value", precision))
    if precision not in PRECISIONS:
        raise InputError(f"{names.said('precision', precision)}: choose float32 or float64")
    return precision


@dataclass(frozen=True)
class Processing:
    """How the weights were processed before measuring; recorded with every result."""

    fold_ln: bool = False
    fold_qk_norm: bool = False
    precision: str = "float32"
    device: str = "cpu"
    layer_form: bool = False
    blocks: tuple[str, ...] | None = None
    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None
    metrics: tuple[str, ...] | None = None
    baseline_seed: int = 0
    dequantized: str | None = None  # the quantization the weights were dequantized from (ModelInfo.quantization)
    products: str = "float32"  # how the large products were computed: "float32", "float64", "bf16" (bf16 read,
    # float32 accumulated: qkinspect.metrics.backend), or several joined by "+" when layers differed
    recomputed_float64: int = 0  # heads measured again in float64: their Grams were unresolved in `precision`
    # (information only: the numbers are the float64 ones, nothing to do)
    qk_norm_not_folded: tuple[str, ...] = ()  # measured blocks with q/k norms whose gains were not folded in: their
    # W_Q W_Kᵀ is the raw stored form, not what attention computes (fold_qk_norm=True / --fold-qk-norm measures that)


@dataclass(frozen=True)
class CompositionProcessing:
    """How the scores were computed; recorded with every result."""

    fold_ln: bool = True
    fold_qk_norm: bool = False
    precision: str = "float32"
    device: str = "cpu"
    kinds: tuple[str, ...] = ("q", "k", "v")
    blocks: tuple[str, ...] | None = None
    from_layers: tuple[int, ...] | None = None
    from_heads: tuple[int, ...] | None = None
    to_layers: tuple[int, ...] | None = None
    to_heads: tuple[int, ...] | None = None
    not_folded: tuple[str, ...] = ()  # "<block> layer <i> <side>" where the model gives no norm to fold
    rotary: tuple[str, ...] = ()  # blocks with rotary positions: their W_QK is the zero-offset form
    qk_norm_not_folded: tuple[str, ...] = ()  # blocks with q/k norms whose gains were not folded in
    dequantized: str | None = None
    by: str = "head"  # "kv-head": the later side grouped by key/value head (by_kv_head)
