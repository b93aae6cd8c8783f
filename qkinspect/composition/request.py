"""What a composition is asked to do, checked once, before torch is imported or the model is opened: the kinds, the
blocks, the selections of both sides (`layers`/`heads`, and `from_*`/`to_*` for one side alone), the precision, the
device and the grouping (`by`); then, from the model's description alone (`check_model`: no weight is read), each
side's selection and the q/k-norm fold.

Errors name each option as the caller spells it (`qkinspect.names.Names`): the library's argument names by default
(`kinds=x`), the CLI's options when the CLI passes `CLI_NAMES` (`--kinds x`).

Example:
    >>> check_request(kinds="k", to_layers="1-2").to_layers
    (1, 2)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from qkinspect.composition.results import BY, KIND_TEXT
from qkinspect.device import requested_device
from qkinspect.errors import InputError
from qkinspect.names import Names
from qkinspect.processing import checked_precision
from qkinspect.selection import blocks_as_given, check_fold_qk_norm, check_selection, indexes_as_given

LIBRARY_NAMES = Names()
CLI_NAMES = Names.cli(blocks="--block")
SIDES = ("", "from_", "to_")  # both sides, the earlier (writing) side alone, the later (reading) side alone

Indexes = tuple[int, ...] | None


@dataclass(frozen=True)
class CompositionRequest:
    """A checked composition request: the kinds in q, k, v order, the blocks as given, each selection as sorted
    indexes (None: all), and how errors name the options (`names`)."""

    kinds: tuple[str, ...]
    blocks: Any
    layers: Indexes
    heads: Indexes
    from_layers: Indexes
    to_layers: Indexes
    from_heads: Indexes
    to_heads: Indexes
    fold_ln: bool
    fold_qk_norm: bool
    precision: str
    device: str
    by: str
    names: Names = LIBRARY_NAMES

    def side(self, side: str) -> tuple[Indexes, Indexes]:
        """The layers and heads of one side ("from" or "to"): its own selection, else both sides'."""
        lay, hd = getattr(self, f"{side}_layers"), getattr(self, f"{side}_heads")
        return (self.layers if lay is None else lay), (self.heads if hd is None else hd)


def _cli(names: Names, option: str) -> bool:
    return getattr(names, option).startswith("--")


def _kinds(kinds: Any, names: Names) -> tuple[str, ...]:
    if kinds is None:
        return tuple(KIND_TEXT)
    texts = [kinds] if isinstance(kinds, str) else list(kinds)
    chosen = list(dict.fromkeys(k.strip() for n in texts for k in str(getattr(n, "value", n)).split(",")
                                if k.strip()))
    if not chosen and _cli(names, "kinds"):
        raise InputError(f"{names.kinds}: no names given (leave the option out for the default)")
    bad = [k for k in chosen if k not in KIND_TEXT]
    if bad or not chosen:
        shown = ",".join(bad) or repr(kinds)
        raise InputError(f"{names.kinds}{' ' if _cli(names, 'kinds') else '='}{shown}: choose among q, k, v")
    return tuple(k for k in KIND_TEXT if k in chosen)


def check_request(*, kinds: str | Iterable[str] | None = None, blocks: str | Iterable[str] | None = None,
                  layers: Any = None, heads: Any = None, from_layers: Any = None, to_layers: Any = None,
                  from_heads: Any = None, to_heads: Any = None, fold_ln: bool = True, fold_qk_norm: bool = False,
                  precision: str = "float32", device: str = "cpu", by: str = "head",
                  names: Names = LIBRARY_NAMES) -> CompositionRequest:
    """The request, checked whole before the model is opened, in the caller's option names (`names`).

    Raises:
        InputError: an unknown kind, precision, device or grouping; a selection that is not indexes.
    """
    chosen = _kinds(kinds, names)
    blocks = blocks_as_given(blocks, names.blocks)
    sel = {opt: indexes_as_given(value, getattr(names, opt)) for opt, value in (
        ("layers", layers), ("heads", heads), ("from_layers", from_layers), ("to_layers", to_layers),
        ("from_heads", from_heads), ("to_heads", to_heads))}
    precision = checked_precision(precision, names)
    device = requested_device(device, names.device)
    by = str(getattr(by, "value", by))
    if by not in BY:
        raise InputError(f"{names.said('by', by)}: choose {' or '.join(BY)}")
    return CompositionRequest(chosen, blocks, **sel, fold_ln=bool(fold_ln), fold_qk_norm=bool(fold_qk_norm),
                              precision=precision, device=device, by=by, names=names)


def check_model(request: CompositionRequest, info) -> list:
    """Each side's selection against the model's description (both sides', then the earlier's, then the later's:
    each refused in the option the caller gave), and the q/k-norm fold; the chosen blocks."""
    names = request.names
    chosen: list = []
    for side in SIDES:
        lay, hd = f"{side}layers", f"{side}heads"
        chosen = check_selection(info, request.blocks, getattr(request, lay), getattr(request, hd),
                                 options=(names.blocks, getattr(names, lay), getattr(names, hd)))
    flag = names.fold_qk_norm if _cli(names, "fold_qk_norm") else f"{names.fold_qk_norm}=True"
    check_fold_qk_norm(chosen, request.fold_qk_norm, flag)
    return chosen
