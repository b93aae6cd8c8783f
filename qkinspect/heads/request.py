"""What a heads run is asked to do, checked once, before torch is imported or the model is opened (amounts,
seed, metrics, the metrics to relate, device); then, from the model's description and tokenizer alone
(`check_positions`: no weight is read), the sequences and windows against the positions the model takes.

Errors name each option as the caller spells it (`qkinspect.names.Names`): the library's argument names by
default (`sequences=0`), the CLI's options when the CLI passes `CLI_NAMES` (`--sequences 0`).

Example:
    >>> check_request(sequences=8, length=16).sequences
    8
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qkinspect.device import requested_device
from qkinspect.errors import InputError
from qkinspect.names import Names
from qkinspect.selection import indexes_as_given

LIBRARY_NAMES = Names()
CLI_NAMES = Names.cli()
# The weight metrics related to the behaviour scores by default: the three the issue asks about (docs/heads.md).
RELATE = ("symmetry", "overlap_qk", "qk_effective_rank")
MAX_SEQUENCES = 1 << 16  # repeated random sequences (each one forward pass row)
MAX_TOKENS = 1 << 16  # --length and --window: far beyond any model's positions, refused before that check
MAX_RESAMPLES = 100_000


@dataclass(frozen=True)
class HeadsRequest:
    """A checked heads request: the text (a path, or None for the built-in text), the amounts, the weight metrics
    (None: analyze's defaults) and those related to the scores, and how errors name the options (`names`)."""

    text: Path | None
    windows: int
    window: int
    sequences: int
    length: int
    seed: int
    batch: int
    metrics: tuple[str, ...] | None
    relate: tuple[str, ...]
    fold_ln: bool
    fold_qk_norm: bool
    resamples: int
    permutations: int
    device: str
    names: Names = LIBRARY_NAMES
    layers: tuple[int, ...] | None = None  # the selection, as analyze's (None: all); checked against the model later
    heads: tuple[int, ...] | None = None


def _count(value: Any, option: str, names: Names, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{names.said(option, value)}: expected a whole number")
    if not low <= value <= high:
        raise InputError(f"{names.said(option, value)}: expected {low} to {high}")
    return value


def _names(value: Any) -> list[str]:
    texts = [value] if isinstance(value, str) else list(value)
    return [n.strip() for t in texts for n in str(t).split(",") if n.strip()]


def check_request(*, text: str | Path | None = None, windows: int = 16, window: int = 128, sequences: int = 64,
                  length: int = 64, seed: int = 0, batch: int = 16, metrics: str | Iterable[str] | None = None,
                  relate: str | Iterable[str] | None = RELATE, fold_ln: bool = False, fold_qk_norm: bool = False,
                  resamples: int = 1000,
                  permutations: int = 1000, device: str = "cpu", names: Names = LIBRARY_NAMES,
                  layers: str | int | Iterable[int] | None = None,
                  heads: str | int | Iterable[int] | None = None) -> HeadsRequest:
    """The request, checked whole before the model is opened, in the caller's option names (`names`). `layers`,
    `heads`: a selection as analyze takes it ("0-3,7", 3, [0, 1]; None: all), parsed by analyze's parser
    (`qkinspect.selection`); whether the model has them is `check_selection`'s, once it is open.

    Raises:
        InputError: an amount out of range (`sequences=0`, `length=1` ...), an unknown metric, a metric to relate
            that is not measured, an unknown device, a selection that is not a list of indexes and ranges.
    """
    from qkinspect.metrics.registry import HEAD_METRIC_NAMES, resolve_metrics

    layers, heads = indexes_as_given(layers, names.layers), indexes_as_given(heads, names.heads)

    windows = _count(windows, "windows", names, 1, MAX_SEQUENCES)
    window = _count(window, "window", names, 2, MAX_TOKENS)
    sequences = _count(sequences, "sequences", names, 1, MAX_SEQUENCES)
    length = _count(length, "length", names, 2, MAX_TOKENS)
    seed = _count(seed, "seed", names, 0, 2**63 - 1)
    batch = _count(batch, "batch", names, 1, MAX_SEQUENCES)
    resamples = _count(resamples, "resamples", names, 0, MAX_RESAMPLES)
    permutations = _count(permutations, "permutations", names, 0, MAX_RESAMPLES)
    chosen = None
    if metrics is not None:
        given = _names(metrics)
        try:
            chosen = tuple(m for m in resolve_metrics(given) if m in HEAD_METRIC_NAMES)
        except InputError as e:
            raise InputError(f"{names.metrics}: {e}") from None
        if not chosen:
            raise InputError(f"{names.said('metrics', ','.join(given))}: no per-head metric among them")
    measured = chosen if chosen is not None else tuple(resolve_metrics(None))
    related = () if relate is None else tuple(dict.fromkeys(_names(relate)))
    bad = [m for m in related if m not in measured]
    if bad:
        raise InputError(f"{names.said('relate', ','.join(bad))}: not among the measured metrics "
                         f"({', '.join(m for m in measured if m in HEAD_METRIC_NAMES)})")
    return HeadsRequest(None if text is None else Path(text), windows, window, sequences, length, seed, batch,
                        chosen, related, bool(fold_ln), bool(fold_qk_norm), resamples, permutations,
                        requested_device(device, names.device), names, layers, heads)


def check_positions(request: HeadsRequest, config: Any, prefix: int, suffix: int) -> None:
    """The repeated sequences (`prefix` + 2 x length + `suffix` tokens) and the text windows against the positions
    transformers' `config` says the model takes (max_position_embeddings, where it says).

    Raises:
        InputError: naming `length` or `window`.
    """
    limit = getattr(config, "max_position_embeddings", None)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
        return
    names = request.names
    need = prefix + 2 * request.length + suffix
    if need > limit:
        raise InputError(f"{names.said('length', request.length)}: a repeated sequence takes {need} positions "
                         f"(2 x {request.length}{f' + {prefix + suffix} special' if prefix + suffix else ''}); "
                         f"this model takes at most {limit}")
    if request.window > limit:
        raise InputError(f"{names.said('window', request.window)}: this model takes at most {limit} positions")
