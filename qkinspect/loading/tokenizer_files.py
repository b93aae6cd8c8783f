"""A tokenizer file where it enters: a regular file of bounded size, UTF-8 text, a vocabulary of bounded length.

Shared by `loading.tokens` (the token strings `analyze` shows) and `experiment.model.guard` (the files handed to
transformers), so both refuse the same files with the same line.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from qkinspect.errors import CheckpointError
from qkinspect.reading import os_reason

MAX_TOKENIZER_BYTES = 64 << 20  # the largest real ones (multilingual vocabularies, Gemma 3: 33 MB) are tens of MB
MAX_VOCAB = 1 << 21  # tokens a vocabulary may hold (real ones: up to ~262k); a tokenizer holds each in a dict


def regular(path: Path, shown: Any = None, limit: int = MAX_TOKENIZER_BYTES) -> int:
    """The size of `path` (after links), which must be a regular file of at most `limit` bytes; CheckpointError
    otherwise (a FIFO, a device or a folder would hang or fail transformers' readers)."""
    shown = path if shown is None else shown
    try:
        st = os.stat(path)
    except OSError as e:
        raise CheckpointError(f"{shown}: cannot read it ({os_reason(e)})") from None
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(f"{shown}: is not a regular file; refused")
    if st.st_size > limit:
        raise CheckpointError(f"{shown}: {st.st_size:,} bytes, more than a tokenizer file has (at most {limit:,})")
    return st.st_size


def utf8_text(path: Path, shown: Any = None) -> str:
    """The file's text, or CheckpointError naming `shown` (default: `path`): not UTF-8, or unreadable."""
    shown = path if shown is None else shown
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{shown}: not UTF-8 text (at byte {e.start})") from None
    except OSError as e:
        raise CheckpointError(f"{shown}: cannot read it ({os_reason(e)})") from None


def too_many_tokens(shown: Any, n: int) -> None:
    """CheckpointError when a vocabulary of `n` tokens is longer than MAX_VOCAB."""
    if n > MAX_VOCAB:
        raise CheckpointError(f"{shown}: {n:,} tokens, more than a vocabulary has (at most {MAX_VOCAB:,})")


__all__ = ["MAX_TOKENIZER_BYTES", "MAX_VOCAB", "regular", "too_many_tokens", "utf8_text"]
