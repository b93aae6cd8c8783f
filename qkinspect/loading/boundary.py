"""The one translation of what a third-party library raises on untrusted input into a CheckpointError line.

The tokenizers library (reading a tokenizer file, for `loading.tokens` and for `experiment`) and transformers
(building a model from a checkpoint, in `experiment`) raise whatever their parsers raise, a Rust panic included.
`boundary` turns any of it into one line naming the file, so bad input is exit 2, never 1.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import Any

from qkinspect.errors import CheckpointError, QkinspectError, one_line


def is_panic(e: BaseException) -> bool:
    """A Rust panic in a native extension (the tokenizers and safetensors libraries, through pyo3): raised as
    ``pyo3_runtime.PanicException``, a BaseException, so ``except Exception`` does not see it."""
    return type(e).__name__ == "PanicException"


@contextlib.contextmanager
def boundary(shown: Any, what: str, native: bool = False) -> Iterator[None]:
    """Any exception a third-party library raises in the block becomes one CheckpointError line naming `shown`:
    ``{shown}: {what} ({the exception})``; a Rust panic too. qkinspect's own errors and interrupts pass through.

    `native`: the block runs the tokenizers library, whose panics print their own message (and, with
    RUST_BACKTRACE, a backtrace) on file descriptor 2 before Python sees them: those lines are kept out of stderr.
    """
    try:
        with quiet_native_stderr() if native else contextlib.nullcontext():
            yield
    except (QkinspectError, KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as e:
        if not isinstance(e, Exception) and not is_panic(e):
            raise
        raise CheckpointError(f"{shown}: {what} ({one_line(e, typed=True)})") from None


@contextlib.contextmanager
def quiet_native_stderr() -> Iterator[None]:
    """File descriptor 2 pointed at a temporary file for the block (what native code writes there is dropped);
    Python's own sys.stderr is untouched unless it is that descriptor, and it is flushed first."""
    import sys

    with contextlib.suppress(Exception):
        sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no descriptor 2 to protect
        yield
        return
    try:
        with tempfile.TemporaryFile() as sink:
            os.dup2(sink.fileno(), 2)
            try:
                yield
            finally:
                with contextlib.suppress(Exception):
                    sys.stderr.flush()
                os.dup2(saved, 2)
    finally:
        os.close(saved)


__all__ = ["boundary", "is_panic", "quiet_native_stderr"]
