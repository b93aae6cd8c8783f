"""Index selections as people write them, for the library and the CLI alike: "0-3,7", 5, [0, 1] or None (all).

Example:
    >>> as_indexes("5,0-2", "layers")
    (0, 1, 2, 5)
    >>> as_indexes(3, "heads")
    (3,)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from qkinspect.errors import InputError

if TYPE_CHECKING:
    from qkinspect.layer import BlockSpec


def parse_indices(text: str | None, option: str) -> tuple[int, ...] | None:
    """"0-3,7" -> (0, 1, 2, 3, 7); None or "" -> None (all). Sorted, duplicates removed; `option` names the
    argument in errors ("--layers" for the CLI, "layers=" for the library).

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
    return range(a, b + 1)


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
    if not all(isinstance(i, int) and not isinstance(i, bool) or hasattr(i, "__index__") for i in items):
        raise InputError(f"{name}={value!r}: every index must be an integer")
    return tuple(sorted({int(i) for i in items}))


def select_blocks(info, blocks: str | Iterable[str] | None) -> list[BlockSpec]:
    """Blocks by key (label or kind) or by kind; InputError naming the model's blocks for an unknown one."""
    if blocks is None:
        return list(info.blocks)
    wanted = [blocks] if isinstance(blocks, str) else list(blocks)
    known = {b.key for b in info.blocks} | {b.name for b in info.blocks}
    missing = [w for w in wanted if w not in known]
    if missing:
        have = ", ".join(dict.fromkeys(b.key for b in info.blocks))
        raise InputError(f"blocks={', '.join(missing)}: this model's blocks are {have}")
    return [b for b in info.blocks if b.key in wanted or b.name in wanted]


def check_indexes(what: str, idx: str | int | Iterable[int] | None, sizes: dict[str, int]) -> tuple[int, ...] | None:
    """Sorted unique indexes ("0-3,7", 3 or [0, 1]); InputError for one no selected block has."""
    out = as_indexes(idx, what)
    if out is None:
        return None
    top = max(sizes.values(), default=0)
    bad = [i for i in out if i < 0 or i >= top]
    if bad:
        have = ", ".join(f"{k}: {n}" for k, n in sizes.items())
        raise InputError(f"{what}={', '.join(map(str, bad))} out of range ({what} per block: {have})")
    return out
