"""What a directions reading is asked to do, checked once, before torch is imported or the model is opened: the
selection, the amounts (`top_directions`, `top_tokens`), the precision, the reading and the device; then, from the
model's description alone (`check_model`: no weight is read), the selection and the q/k-norm fold.

Errors name each option as the caller spells it (`qkinspect.names.Names`): the library's argument names by default
(`top_tokens=0`), the CLI's options when the CLI passes `CLI_NAMES` (`--top-tokens 0`).

Example:
    >>> check_request(layers="0-1", top_directions=2).layers
    (0, 1)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qkinspect.device import requested_device
from qkinspect.errors import InputError
from qkinspect.names import Names
from qkinspect.processing import checked_precision
from qkinspect.selection import blocks_as_given, check_fold_qk_norm, check_selection, indexes_as_given

LIBRARY_NAMES = Names()
CLI_NAMES = Names.cli(blocks="--block")
READINGS = ("dot", "cosine")
MAX_DIRECTIONS = 4096
MAX_TOKENS = 1000


@dataclass(frozen=True)
class DirectionsRequest:
    """A checked directions request: the blocks as given, the layers and heads as sorted indexes (None: all)."""

    blocks: Any
    layers: tuple[int, ...] | None
    heads: tuple[int, ...] | None
    top_directions: int
    top_tokens: int
    fold_ln: bool
    fold_qk_norm: bool
    precision: str
    device: str
    reading: str
    names: Names = LIBRARY_NAMES


def check_request(*, layers: Any = None, heads: Any = None, blocks: Any = None, top_directions: int = 3,
                  top_tokens: int = 10, fold_ln: bool = False, fold_qk_norm: bool = False,
                  precision: str = "float32", device: str = "cpu", reading: str = "dot",
                  names: Names = LIBRARY_NAMES) -> DirectionsRequest:
    """The request, checked whole before the model is opened, in the caller's option names (`names`).

    Raises:
        InputError: a selection that is not indexes, an amount out of range, an unknown precision or reading, a
            device that is not there.
    """
    layers = indexes_as_given(layers, names.layers)
    heads = indexes_as_given(heads, names.heads)
    blocks = blocks_as_given(blocks, names.blocks)
    for option, value, top in (("top_directions", top_directions, MAX_DIRECTIONS),
                               ("top_tokens", top_tokens, MAX_TOKENS)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
            spelled = getattr(names, option)
            raise InputError(f"{spelled}: {value} must be from 1 to {top}" if spelled.startswith("--") else
                             f"{spelled}={value!r}: give a whole number from 1 to {top}")
    precision = checked_precision(precision, names)
    reading = str(getattr(reading, "value", reading))
    if reading not in READINGS:
        raise InputError(f"{names.said('reading', reading)}: choose dot or cosine")
    device = requested_device(device, names.device)
    return DirectionsRequest(blocks, layers, heads, top_directions, top_tokens, bool(fold_ln), bool(fold_qk_norm),
                             precision, device, reading, names)


def check_model(request: DirectionsRequest, info) -> list:
    """The selection against the model's description and the q/k-norm fold, in the caller's option names; the
    chosen blocks."""
    names = request.names
    chosen = check_selection(info, request.blocks, request.layers, request.heads,
                             options=(names.blocks, names.layers, names.heads))
    flag = names.fold_qk_norm if names.fold_qk_norm.startswith("--") else f"{names.fold_qk_norm}=True"
    check_fold_qk_norm(chosen, request.fold_qk_norm, flag)
    return chosen
