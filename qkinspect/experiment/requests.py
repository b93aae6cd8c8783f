"""What an experiment is asked to do, checked before any file or model is opened: the edits, the scope and the
bounds on its amounts (`--tokens`, `--window`, `--probes`, `--verify`). Torch-free, so that a bad value is refused
at once."""

from __future__ import annotations

from collections.abc import Sequence

from qkinspect.errors import InputError
from qkinspect.experiment.edits.names import Edit, parse_edit

SCOPES = ("head", "layer", "model")  # --scope
MAX_TOKENS = 1 << 24  # --tokens and --window: at most this many (16,777,216)
BYTES_PER_TOKEN = 64  # --text read for N tokens: its first 64·N bytes (at least 1 MiB, at most 64 MiB)


def check_amounts(tokens: int, window: int) -> None:
    """InputError unless 2 <= --tokens, --window <= MAX_TOKENS."""
    if tokens < 2 or window < 2:
        raise InputError(f"--tokens {tokens} / --window {window}: both must be at least 2")
    for name, value in (("--tokens", tokens), ("--window", window)):
        if value > MAX_TOKENS:
            raise InputError(f"{name} {value}: at most {MAX_TOKENS} (2**24) tokens")


def check_estimate(scope: str, estimate: bool, probes: int | None, verify: int | None) -> None:
    if estimate and scope != "head":
        raise InputError(f"--estimate estimates heads one by one: use it with --scope head, not {scope}")
    if not estimate and (verify or probes is not None):
        raise InputError(f"{'--verify' if verify else '--probes'} applies to --estimate only")
    if probes is not None and not 2 <= probes <= 4096:
        raise InputError(f"--probes {probes}: expected 2 to 4096 (the curvature term's standard error needs two)")
    if verify is not None and verify < 0:
        raise InputError(f"--verify {verify}: expected a number of heads, 0 or more")


def parse_edits(edits: str | Sequence[str]) -> list[Edit]:
    """The edits asked for ("share_qk,rank:8" or a list of edit texts), each once, in order."""
    texts = edits.split(",") if isinstance(edits, str) else list(edits)
    out = list(dict.fromkeys(parse_edit(t) for t in texts if t.strip()))
    if not out:
        raise InputError("--edit: name at least one edit")
    return out
