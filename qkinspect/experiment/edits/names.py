"""The edits' names and their syntax (`rank:8`), without torch: a misspelt `--edit` is refused before anything
heavy is imported (docs/experiments.md, "Edits")."""

from __future__ import annotations

import re
from dataclasses import dataclass

from qkinspect.errors import InputError
from qkinspect.suggest import did_you_mean

_DIGITS = re.compile(r"[0-9]{1,9}")
EDITS = ("share_qk", "tie_q", "tie_k", "symmetric", "rank", "share_qkv", "ablate")


class EditError(InputError):
    """An edit that is misspelt, or not defined for this layer (exit code 2)."""


@dataclass(frozen=True)
class Edit:
    """One edit: its name, and K for `rank:K`."""

    name: str
    k: int | None = None

    def __str__(self) -> str:
        return self.name if self.k is None else f"{self.name}:{self.k}"


def parse_edit(text: str) -> Edit:
    """`"rank:8"` -> Edit("rank", 8); raises EditError on anything else than the names in EDITS."""
    name, sep, arg = text.strip().partition(":")
    if name not in EDITS:
        hint = did_you_mean(name, EDITS)
        raise EditError(f"unknown edit {text!r}{hint}; expected one of {', '.join(EDITS)} (rank as rank:K)")
    if name == "rank":
        if not sep or _DIGITS.fullmatch(arg) is None:  # ASCII digits: str.isdigit also takes "³" and "٣"
            raise EditError(f"edit {text!r}: rank takes a whole number of dimensions, e.g. rank:8")
        return Edit(name, int(arg))
    if sep:
        raise EditError(f"edit {text!r}: {name} takes no argument")
    return Edit(name)
