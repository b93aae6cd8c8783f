"""The twins' text: read once, split into training and held-out text, tokenized, and cut into batches.

- Text: a UTF-8 file, every `.txt` in a folder (sorted by name), or with none Python's own `pydoc_data.topics` (a
  demo). Held-out text is contiguous: the last `HELD_OUT` of each file, never random windows of the training text.
- Tokenizer: `char` (the training text's characters; one id for any other), `byte` (the 256 bytes of the UTF-8
  encoding) or `bpe:N` (byte-level BPE trained locally with `tokenizers` on the training split only).
- Batches: seed s fixes the order (`batch_starts`): windows of `context + 1` tokens at random offsets of the training
  stream, drawn from one generator per seed, so every twin of a seed sees the same batches.
- Evaluation: a fixed subset of held-out windows, evenly spaced, non-overlapping (`eval_starts`).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qkinspect.errors import InputError
from qkinspect.names import Names
from qkinspect.twin.request import LIBRARY_NAMES

HELD_OUT = 0.1  # the last tenth of each file is held out
MAX_TEXT_BYTES = 1 << 30
UNK = "\ufffd"  # char tokenizer: the id of any character the training text does not have


@dataclass(frozen=True)
class Part:
    """One file's text, split: training (its first 90 %) and held-out (its last 10 %)."""

    name: str
    train: str
    held_out: str


@dataclass(frozen=True)
class Corpus:
    """The text as the twins see it: its name, sha256, characters, and each file's split."""

    name: str
    sha256: str
    chars: int
    parts: tuple[Part, ...]
    demo: bool


def read_corpus(text: Path | None, names: Names = LIBRARY_NAMES) -> Corpus:
    """The files of `text` (a file or every .txt of a folder), or the pydoc demo text; each split once."""
    if text is None:
        from qkinspect.experiment.model.scoring import default_text

        demo = default_text()
        files = [(demo.name, demo.text)]
        name, is_demo = demo.name, True
    else:
        files = [(p.name, body) for p, body in _read_all(text, names)]
        name, is_demo = str(text), False
    h = hashlib.sha256()
    for fname, body in files:
        h.update(fname.encode() + b"\0" + body.encode() + b"\0")
    parts = []
    for fname, body in files:
        cut = len(body) - max(1, int(len(body) * HELD_OUT))
        parts.append(Part(fname, body[:cut], body[cut:]))
    return Corpus(name, h.hexdigest(), sum(len(b) for _, b in files), tuple(parts), is_demo)


def _read_all(text: Path, names: Names) -> list[tuple[Path, str]]:
    """The file `text`, or every .txt entry of the folder `text` by name; each read bounded (qkinspect.reading:
    a regular file, at most what is left of `MAX_TEXT_BYTES` for them all), a link to a file outside the folder
    refused: nothing outside the given paths is read."""
    if not text.is_dir():
        return [(text, _read(text, MAX_TEXT_BYTES, names))]
    root = os.path.realpath(text)
    try:
        with os.scandir(text) as entries:
            paths = sorted(text / e.name for e in entries if e.name.endswith(".txt") and not e.is_dir())
    except OSError as e:
        raise InputError(f"{names.said('text', text)}: cannot read the folder ({e.strerror or e})") from None
    if not paths:
        raise InputError(f"{names.said('text', text)}: the folder has no .txt file")
    for p in paths:
        real = os.path.realpath(p)
        if os.path.commonpath([root, real]) != root:
            raise InputError(f"{names.said('text', p)}: a link to {real}, outside the folder {text}; refused")
    out, left = [], MAX_TEXT_BYTES
    for p in paths:
        body = _read(p, left, names)
        left -= len(body.encode("utf-8"))
        out.append((p, body))
    return out


def _read(path: Path, limit: int, names: Names) -> str:
    from qkinspect.reading import read_text

    try:
        return read_text(path, limit=limit, what="the text")
    except InputError as e:  # the reader's line, naming the file as the caller's option
        said = names.said("text", path)
        message = str(e)
        raise InputError(f"{said}: {message.removeprefix(f'{path}: ')}") from None


class Tokenizer:
    """`encode(str) -> list[int]` and `vocab_size`; `describe()` says what it is, `sha256` fixes it."""

    def __init__(self, kind: str, train: list[str]):
        self.kind = kind
        if kind == "byte":
            self.vocab_size, self.table = 256, None
        elif kind == "char":
            chars = sorted(set("".join(train)) | {UNK})
            self.table = {c: i for i, c in enumerate(chars)}
            self.vocab_size = len(chars)
        else:
            self.table = None
            self.bpe = _train_bpe(train, int(kind.partition(":")[2]))
            self.vocab_size = self.bpe.get_vocab_size()

    def encode(self, text: str) -> np.ndarray:
        if self.kind == "byte":
            return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)
        if self.kind == "char":
            unk = self.table[UNK]
            return np.fromiter((self.table.get(c, unk) for c in text), dtype=np.int32, count=len(text))
        return np.asarray(self.bpe.encode(text).ids, dtype=np.int32)

    def serialized(self) -> str:
        """The tokenizer as text (what its sha256 is of): the char table, "byte", or the BPE's JSON."""
        if self.kind == "byte":
            return "byte"
        if self.kind == "char":
            return json.dumps(sorted(self.table, key=self.table.__getitem__), ensure_ascii=False)
        return self.bpe.to_str()

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.serialized().encode()).hexdigest()


def _train_bpe(train: list[str], n: int):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=n, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(train, trainer=trainer)
    return tok


@dataclass(frozen=True)
class Tokens:
    """The token streams: training (each file's training part, in file order) and held-out (alike)."""

    train: np.ndarray
    held_out: np.ndarray
    vocab_size: int


def tokenize(corpus: Corpus, tokenizer: Tokenizer) -> Tokens:
    train = np.concatenate([tokenizer.encode(p.train) for p in corpus.parts])
    held = np.concatenate([tokenizer.encode(p.held_out) for p in corpus.parts])
    return Tokens(train, held, tokenizer.vocab_size)


def check_lengths(tokens: Tokens, context: int, names: Names = LIBRARY_NAMES) -> None:
    for what, stream in (("training", tokens.train), ("held-out", tokens.held_out)):
        if len(stream) < context + 1:
            raise InputError(f"{names.text}: the {what} text has {len(stream)} tokens, fewer than one window of "
                             f"{names.said('context', context)} + 1")


def batch_starts(n_tokens: int, context: int, batch: int, steps: int, seed: int) -> np.ndarray:
    """(steps, batch) window offsets into the training stream: seed `seed`'s batch order, the same for every twin."""
    rng = np.random.Generator(np.random.PCG64(seed))
    return rng.integers(0, n_tokens - context, size=(steps, batch), dtype=np.int64)


def eval_starts(n_tokens: int, context: int, windows: int) -> np.ndarray:
    """Offsets of up to `windows` non-overlapping held-out windows of `context + 1` tokens, evenly spread."""
    whole = (n_tokens - 1) // context  # windows that fit without overlap (targets shifted by one)
    picked = np.linspace(0, whole - 1, num=min(windows, whole)).round().astype(np.int64)
    return np.unique(picked) * context


def gather(stream: np.ndarray, starts: np.ndarray, context: int) -> np.ndarray:
    """(len(starts), context + 1) token windows."""
    return stream[starts[:, None] + np.arange(context + 1)[None, :]]
