"""The bounds on an experiment's amounts (`--tokens`, `--window`), checked before any file or model is opened
(torch-free, so the CLI refuses a bad value at once)."""

from __future__ import annotations

from qkinspect.errors import InputError

MAX_TOKENS = 1 << 24  # --tokens and --window: at most this many (16,777,216)
BYTES_PER_TOKEN = 64  # --text read for N tokens: its first 64·N bytes (at least 1 MiB, at most 64 MiB)


def check_amounts(tokens: int, window: int) -> None:
    """InputError unless 2 <= --tokens, --window <= MAX_TOKENS."""
    if tokens < 2 or window < 2:
        raise InputError(f"--tokens {tokens} / --window {window}: both must be at least 2")
    for name, value in (("--tokens", tokens), ("--window", window)):
        if value > MAX_TOKENS:
            raise InputError(f"{name} {value}: at most {MAX_TOKENS} (2**24) tokens")
