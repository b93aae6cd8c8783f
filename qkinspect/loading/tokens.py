"""A model's own token strings, by id: from a folder's tokenizer.json (the tokenizers library parses it; no code
runs), else its vocab.txt, else a GGUF's ``tokenizer.ggml.tokens``. Untrusted input: each file is checked where it
enters (inside the model's folder, a regular file of bounded size, UTF-8), and anything the tokenizers library
raises (or a Rust panic) is one CheckpointError naming the file.

Tokens are shown as the text they stand for: byte-level BPE symbols (GPT-2's ``Ġ`` for a space) mapped back to
their bytes, SentencePiece's ``▁`` as a space and its byte tokens ``<0x0A>`` as the byte; WordPiece's ``##`` kept
(it says the token continues a word). `printable` then makes whitespace and control characters visible for tables.

Example:
    >>> printable(" the\\n")
    '␣the\\\\n'
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qkinspect.errors import CheckpointError
from qkinspect.loading.boundary import boundary
from qkinspect.loading.checked import inside
from qkinspect.loading.tokenizer_files import MAX_VOCAB, regular, too_many_tokens, utf8_text


@dataclass(frozen=True)
class Vocabulary:
    """Tokens by id as the vocabulary stores them (`raw[i]`; None: an id it leaves unused), where they came from (a
    file, or the GGUF's metadata) and how they are written (`style`); `get(i)` gives a token's text."""

    raw: tuple[str | None, ...]
    source: str
    style: str  # "byte-level", "sentencepiece", "wordpiece" or "plain"

    def __len__(self) -> int:
        return len(self.raw)

    def get(self, i: int) -> str | None:
        """The token's text, or None for an id past the vocabulary (an embedding padded beyond it) or unused."""
        t = self.raw[i] if 0 <= i < len(self.raw) else None
        return None if t is None else _shown(t, self.style)


def read_vocabulary(resolved: Any) -> Vocabulary | None:
    """The vocabulary of an opened checkpoint (`loading.resolve.Resolved`), or None when it has none (a folder
    without tokenizer files, a GGUF without a token list, a model in memory).

    Raises:
        CheckpointError: a tokenizer file that cannot be read, is not what it claims, or holds too many tokens.
    """
    vocabulary = getattr(resolved.source, "vocabulary", None)
    if resolved.format == "gguf" and vocabulary is not None:
        found = vocabulary(MAX_VOCAB)
        if found is None:
            return None
        tokens, model = found
        style = {"gpt2": "byte-level", "llama": "sentencepiece", "bert": "wordpiece"}.get(model or "", "plain")
        return Vocabulary(tuple(tokens), f"{resolved.path} (tokenizer.ggml.tokens)", style)
    if getattr(resolved, "model", None) is not None or resolved.path is None:
        return None
    folder = Path(resolved.path)
    folder = folder if folder.is_dir() else folder.parent
    if os.path.lexists(folder / "tokenizer.json"):
        return _tokenizer_json(folder)
    if os.path.lexists(folder / "vocab.txt"):
        return _vocab_txt(folder)
    return None


def _checked_text(folder: Path, name: str) -> tuple[Path, str]:
    """A tokenizer file's text: inside the folder (after links), a regular file of bounded size, UTF-8."""
    path = inside(folder, name, folder, "tokenizer file")
    regular(path, folder / name)
    return folder / name, utf8_text(path, folder / name)


def _tokenizer_json(folder: Path) -> Vocabulary:
    shown, text = _checked_text(folder, "tokenizer.json")
    with boundary(shown, "not a tokenizer the tokenizers library can read", native=True):
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(text)  # the library's own parser; nothing in the file runs
        ids = tok.get_vocab(with_added_tokens=True)  # token -> id; added tokens may sit past the model's ids
        n = max(ids.values(), default=-1) + 1
        if n > MAX_VOCAB:
            raise CheckpointError(f"{shown}: token ids up to {n - 1:,}, more than a vocabulary has "
                                  f"(at most {MAX_VOCAB:,})")
        raw: list[str | None] = [None] * n
        for token, i in ids.items():
            raw[i] = token
    try:
        style = _style(json.loads(text))
    except (ValueError, RecursionError):  # the tokenizers library read it; only the display style is lost
        style = "plain"
    return Vocabulary(tuple(raw), str(shown), style)


def _vocab_txt(folder: Path) -> Vocabulary:
    shown, text = _checked_text(folder, "vocab.txt")
    tokens = text.split("\n")
    if tokens and tokens[-1] == "":
        tokens.pop()  # the newline after the last token
    too_many_tokens(shown, len(tokens))
    return Vocabulary(tuple(t.rstrip("\r") for t in tokens), str(shown), "wordpiece")


def _style(data: Any) -> str:
    """How a tokenizer.json writes its tokens, from its decoder (and model): byte-level, sentencepiece, wordpiece."""
    def kinds(node: Any) -> list[str]:
        if not isinstance(node, dict):
            return []
        inner = node.get("decoders") if isinstance(node.get("decoders"), list) else []
        return [str(node.get("type")), *(k for d in inner for k in kinds(d)),
                *(["sentencepiece"] if node.get("type") == "Replace" and "▁" in json.dumps(node) else [])]

    found = kinds(data.get("decoder") if isinstance(data, dict) else None)
    model = data.get("model") if isinstance(data, dict) else None
    if "ByteLevel" in found:
        return "byte-level"
    if "Metaspace" in found or "sentencepiece" in found or "ByteFallback" in found:
        return "sentencepiece"
    if "WordPiece" in found or (isinstance(model, dict) and model.get("type") == "WordPiece"):
        return "wordpiece"
    return "plain"


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the printable stand-in for each byte -> the byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


_BYTES = {ord(c): b for c, b in _byte_decoder().items()}  # for str.translate: each symbol -> its byte's code point


def _shown(token: str, style: str) -> str:
    """The text a raw vocabulary entry stands for (see the module docstring)."""
    if style == "byte-level":
        try:  # symbols outside the byte alphabet (an added token's own text) stay as they are
            return token.translate(_BYTES).encode("latin-1").decode("utf-8", errors="backslashreplace")
        except UnicodeEncodeError:
            return token
    if style == "sentencepiece":
        if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            try:
                b = int(token[3:5], 16)
            except ValueError:
                return token
            return chr(b) if b < 0x80 else f"\\x{b:02x}"
        return token.replace("▁", " ")
    return token


def printable(text: str | None) -> str:
    """A token's text made visible for a table: spaces as ␣, newlines and tabs as \\n and \\t, other control
    and invisible characters as \\xNN / \\uNNNN; None (an id past the vocabulary) as ∅."""
    if text is None:
        return "∅"
    out = []
    for c in text:
        if c == " ":
            out.append("␣")
        elif c in "\n\t\r":
            out.append({"\n": "\\n", "\t": "\\t", "\r": "\\r"}[c])
        elif not c.isprintable():
            out.append(f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return "".join(out) or "\"\""


__all__ = ["Vocabulary", "read_vocabulary", "printable", "MAX_VOCAB"]
