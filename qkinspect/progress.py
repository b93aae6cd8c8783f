"""Progress of a long library call, phase by phase, for whoever shows it (the CLI's bar on stderr, a notebook's).

A function that takes `progress=` accepts either
- a plain callable `progress(done, total)`: called after each unit of every countable phase (the count starts
  again at each phase), or
- an object that also has `phase(name, total, unit)`: told when each phase begins (its name, how many units it
  has, or None where they cannot be counted, such as loading a model, and what a unit is), then called as
  `progress(done, total, status)` after each unit, `status` a short text such as the current training loss.

The library calls `phase(progress, ...)` below at the start of each phase that can take more than a few seconds
and ticks the callable it returns; it never draws anything itself (docs/progress.md).

Example:
    >>> class Show:
    ...     def phase(self, name, total, unit): print("phase", name, total, unit)
    ...     def __call__(self, done, total, status=""): print(done, total, status)
    >>> tick = phase(Show(), "healing", 2, "steps")
    phase healing 2 steps
    >>> tick(1, status="loss 3.21")
    1 2 loss 3.21
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable


@runtime_checkable
class Phases(Protocol):
    """A progress receiver that knows phases (the CLI's `Progress` is one)."""

    def phase(self, name: str, total: int | None, unit: str) -> None: ...

    def __call__(self, done: int, total: int | None, status: str = "") -> None: ...


Tick = Callable[..., None]  # tick(done, status="")


def phase(progress: Callable | None, name: str, total: int | None = None, unit: str = "") -> Tick:
    """Begin phase `name` of `total` units (None: not countable) on `progress`; returns `tick(done, status="")`
    to call after each unit (a no-op for no receiver, and for a plain callable in a phase it cannot count)."""
    if progress is None:
        return _nothing
    if isinstance(progress, Phases):
        progress.phase(name, total, unit)

        def tick(done: int, status: str = "") -> None:
            progress(done, total, status)

        return tick
    if total is None:
        return _nothing

    def plain(done: int, status: str = "") -> None:
        progress(done, total)

    return plain


def _nothing(done: int = 0, status: str = "") -> None:
    return None


class Lines:
    """A receiver that prints a line per phase and per unit done on stderr (or `file`): for a notebook or a log,
    where no bar is drawn. `qkinspect.twin(..., progress=Lines())` prints a line as each run finishes.

    Example:
        >>> import sys
        >>> show = Lines(file=sys.stdout)
        >>> tick = phase(show, "twins", 2, "runs")
        twins: 2 runs
        >>> tick(1, status="standard-s0-lr0.001: held-out loss 2.8635 in 3 s")
        twins: 1/2 runs  standard-s0-lr0.001: held-out loss 2.8635 in 3 s
    """

    def __init__(self, file=None):
        self.file = file
        self.name, self.unit = "", ""

    def _print(self, line: str) -> None:
        import sys

        print(line, file=self.file or sys.stderr, flush=True)

    def phase(self, name: str, total: int | None, unit: str) -> None:
        self.name, self.unit = name, unit
        self._print(f"{name}: {'?' if total is None else total} {unit}".rstrip())

    def __call__(self, done: int, total: int | None, status: str = "") -> None:
        line = f"{self.name}: {done}/{'?' if total is None else total} {self.unit}".rstrip()
        self._print(f"{line}  {status}" if status else line)
