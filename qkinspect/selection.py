"""Index selections as people write them, for the library and the CLI alike: "0-3,7", 5, [0, 1] or None (all).

Example:
    >>> as_indexes("5,0-2", "layers")
    (0, 1, 2, 5)
    >>> as_indexes(3, "heads")
    (3,)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from qkinspect.errors import InputError
from qkinspect.suggest import did_you_mean

if TYPE_CHECKING:
    from qkinspect.layer import BlockSpec


MAX_INDEX = 100_000  # no model has this many layers or heads; a range past it is refused before it is built


def parse_indices(text: str | None, option: str) -> tuple[int, ...] | None:
    """"0-3,7" -> (0, 1, 2, 3, 7); None or "" -> None (all). Sorted, duplicates removed; `option` names the
    argument in errors ("--layers" for the CLI, "layers=" for the library). Every index is checked against
    MAX_INDEX before any range is expanded (the model's own bounds are checked later), so "0-1000000000000" costs
    nothing.

    Example:
        >>> parse_indices("5,0-2", "--layers")
        (0, 1, 2, 5)
    """
    if text is None or not text.strip():
        return None
    out: set[int] = set()
    for part in text.split(","):
        out.update(_parse_range(part.strip(), option))
    return tuple(sorted(out))


def _parse_range(part: str, option: str) -> range:
    lo, sep, hi = part.partition("-")
    try:
        a = int(lo)
        b = int(hi) if sep else a
    except ValueError:
        raise InputError(f"{option}: {part!r} is not an index or a range like 0-3") from None
    if a < 0 or b < a:
        raise InputError(f"{option}: {part!r} is not a valid range (indices start at 0, low-high)")
    if b >= MAX_INDEX:
        raise InputError(f"{option}: {b} is out of range (no model has {MAX_INDEX:,} layers or heads)")
    return range(a, b + 1)


def spans(indexes: Iterable[int]) -> str:
    """Sorted indexes as `parse_indices` reads them, in ranges: (12, 13, 14, 17) -> "12-14,17".

    Example:
        >>> spans((0, 1, 2, 5))
        '0-2,5'
    """
    out: list[list[int]] = []
    for i in indexes:
        if out and i == out[-1][-1] + 1:
            out[-1].append(i)
        else:
            out.append([i])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in out)


def as_indexes(value: str | int | Iterable[int] | None, name: str) -> tuple[int, ...] | None:
    """A library selection argument (`layers=`, `heads=`) as sorted unique indexes; None means all.

    Raises:
        InputError: naming the argument as `name=`, for text that is not a list of indexes and ranges, or items
            that are not integers.
    """
    if value is None:
        return None
    if isinstance(value, str):
        return parse_indices(value, f"{name}={value!r}")
    if isinstance(value, bool):
        raise InputError(f"{name}={value!r}: give indexes such as [0, 1] or '0-3,7'")
    if isinstance(value, int):
        value = [value]
    try:
        items = list(value)
    except TypeError:
        raise InputError(f"{name}={value!r}: give indexes such as [0, 1] or '0-3,7'") from None
    if not all(not isinstance(i, bool) and (isinstance(i, int) or hasattr(i, "__index__")) for i in items):
        raise InputError(f"{name}={value!r}: every index must be an integer")
    return tuple(sorted({int(i) for i in items}))


LIBRARY_OPTIONS = ("blocks", "layers", "heads")  # how the library's callers name the selection (its arguments)


def indexes_as_given(value, option: str) -> tuple[int, ...] | None:
    """A selection as the caller gave it, refused in its words: `option` is its spelling, a CLI option ("--layers":
    text, `parse_indices`; a whole number, as `spectrum --layer` takes it, is an index) or a library argument
    ("layers": text or indexes, `as_indexes`)."""
    if option.startswith("--") and (value is None or isinstance(value, str)):
        return parse_indices(value, option)
    return as_indexes(value, option)


def blocks_as_given(blocks, option: str):
    """Block names as the caller gave them: a CLI option ("--block": comma-separated and/or repeated, duplicates
    removed, nothing in them refused) or a library argument (passed on as given, for `check_selection`)."""
    if blocks is None or not option.startswith("--"):
        return blocks
    parts = [blocks] if isinstance(blocks, str) else list(blocks)
    chosen = tuple(dict.fromkeys(n.strip() for p in parts for n in p.split(",") if n.strip()))
    if not chosen:
        raise InputError(f"{option}: no names given (leave the option out for the default)")
    return chosen


def check_selection(info, blocks: str | Iterable[str] | None, layers: Sequence[int] | None,
                    heads: Sequence[int] | None = None, *,
                    options: tuple[str, str, str] = LIBRARY_OPTIONS) -> list[BlockSpec]:
    """The selected blocks (every block when `blocks` is None; a kind such as "encoder" selects every block of
    that kind, e.g. CLIP's two towers); InputError for a block, layer or head the model does not have, naming
    what it has and the option as the caller spells it: `options` are the block, layer and head options' names
    ("--block", "--layers", "--heads" from the CLI, spectrum's "--layer" and "--head"; by default the library's
    arguments: "layers=9 is out of range; ..."). The one selection check of qkinspect: the library, every command
    and the experiment use it.

    Example:
        >>> [b.key for b in check_selection(model.info, ("encoder",), (0, 1), None)]  # doctest: +SKIP
        ['encoder']
    """
    chosen = list(info.blocks)
    if blocks:
        wanted = [blocks] if isinstance(blocks, str) else list(blocks)
        known = {b.name for b in info.blocks} | {b.key for b in info.blocks}
        missing = [b for b in wanted if b not in known]
        if missing:
            have = ", ".join(dict.fromkeys(b.key for b in info.blocks))
            hint = did_you_mean(missing[0], known)
            raise InputError(f"{_said(options[0], ','.join(missing), ' ')}{hint}: this model's blocks are {have}")
        chosen = [b for b in info.blocks if b.key in wanted or b.name in wanted]
    _check_range(options[1], layers, {b.key: b.n_layers for b in chosen}, "layers")
    _check_range(options[2], heads, {b.key: b.n_heads for b in chosen}, "heads")
    return chosen


def _check_range(option: str, wanted: Sequence[int] | None, sizes: dict[str, int], what: str) -> None:
    if wanted is None:
        return
    if not len(wanted):
        raise InputError(f"{option}: no {what} given (leave the option out for all)")
    bad = min(wanted) if min(wanted) < 0 else max(wanted)
    if bad < 0 or bad >= max(sizes.values(), default=0):
        have = ", ".join(f"{k} has {what} 0-{n - 1}" for k, n in sizes.items())
        raise InputError(f"{_said(option, bad, ': ')} is out of range; {have}")


def _said(option: str, value: object, cli: str) -> str:
    """`option` with `value`: "--layers: 9" / "--block x" (`cli` joins a CLI option to its value), "layers=9"."""
    return f"{option}{cli}{value}" if option.startswith("--") else f"{option}={value}"


def check_fold_qk_norm(chosen: Iterable[BlockSpec], fold_qk_norm: bool, option: str = "fold_qk_norm=True") -> None:
    """InputError when q/k-norm gains are to be folded but none of the `chosen` blocks has q/k norms (as folding
    layer norms is refused on a model without them); `option` is the caller's spelling (the CLI's --fold-qk-norm)."""
    if fold_qk_norm and not any(b.qk_norm for b in chosen):
        raise InputError(f"{option}: the selected blocks have no q/k norm")
