"""How a caller names its options in errors: one type for every capability (analysis, sweep, atlas, and, as they
move, experiment, composition, directions). The library's argument names by default (`workers=0`), the CLI's options
when the CLI passes its own (`--workers 0`), so a request is checked once, in the library, in the caller's words.

Example:
    >>> Names().said("workers", 0)
    'workers=0'
    >>> Names.cli(from_file="--from").said("hf_cache", True)
    '--hf-cache True'
"""

from __future__ import annotations

from qkinspect.errors import said


class Names:
    """How the caller names each option: as `spelled` names it, else the option's own name (the library's
    argument), or, for a CLI's names (`Names.cli`), "--" and the option with "-" for "_"."""

    __slots__ = ("_cli", "_spelled")

    def __init__(self, *, cli: bool = False, **spelled: str) -> None:
        object.__setattr__(self, "_cli", cli)
        object.__setattr__(self, "_spelled", dict(spelled))

    @classmethod
    def cli(cls, **spelled: str) -> Names:
        """A CLI's names: `--option-name` for each option, except those `spelled` otherwise."""
        return cls(cli=True, **spelled)

    def __getattr__(self, option: str) -> str:
        if option.startswith("__"):
            raise AttributeError(option)
        if option in self._spelled:
            return self._spelled[option]
        return "--" + option.replace("_", "-") if self._cli else option

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Names are frozen")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Names) and (self._cli, self._spelled) == (other._cli, other._spelled)

    def __hash__(self) -> int:
        return hash((self._cli, tuple(sorted(self._spelled.items()))))

    def __repr__(self) -> str:
        return f"Names(cli={self._cli}, {self._spelled})"

    def said(self, option: str, value: object, quoted: bool = False) -> str:
        """`option` given `value`, as the caller wrote it: "--scheduler x" (CLI) or "scheduler='x'" (library)."""
        return said(getattr(self, option), value, quoted)
