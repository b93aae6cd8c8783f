"""The boundary between `experiment` and transformers: what transformers may read, and what it may raise.

`analyze` reads a checkpoint through qkinspect's own checked readers; `experiment` also hands it to transformers,
which opens more files (the tokenizer's, generation_config.json, adapter_config.json ...) by name, follows links,
runs its own parsers and raises whatever they raise. So, before transformers sees anything:

- `staged`: a private temporary folder holding only what the run needs, each file checked as the weights are
  checked (`qkinspect.loading.checked.inside`: a relative name that resolves, after links, inside the model's
  folder; a regular file; of bounded size): links to the weights and the tokenizer's files, and copies of the small
  JSON files written from their checked contents, with ``auto_map`` left out (it names remote code, which is never
  run: the model_type alone chooses transformers' own classes) and the switches that say how to run the model
  rather than what it is (`RUNTIME_KEYS`: attn_implementation, return_dict ...). transformers is pointed at that
  folder, so no other file of the model's folder, and nothing outside it, is opened.
- `check_tokenizer_files`: tokenizer.json parsed by the tokenizers library itself, vocab.txt UTF-8 text with its
  unknown token, JSON files objects, where they enter, with the file named.
- `check_config`: the config values the runner uses and transformers checks only while it builds the model
  (pad_token_id within the vocabulary, a known RoPE type).
- `qkinspect.loading.boundary.boundary` (below this package, as the tokenizer-file checks of
  `qkinspect.loading.tokenizer_files` are, since `loading.tokens` needs them too): the one translation of a
  third-party exception into `CheckpointError` (loading the config, the model and the tokenizer, tokenizing, the
  first forward pass), naming the file: bad input is exit 2, never 1.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qkinspect.errors import CheckpointError
from qkinspect.loading.boundary import boundary
from qkinspect.loading.checked import inside, read_json
from qkinspect.loading.tokenizer_files import regular, too_many_tokens, utf8_text

# Files a transformers tokenizer may read from a folder (transformers 4 and 5, fast and slow classes).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.txt", "vocab.json", "merges.txt", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model")
# Small JSON files copied (from their checked contents, auto_map left out) rather than linked.
COPIED = ("config.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")
WEIGHT_INDEXES = (("model.safetensors.index.json", "model.safetensors"),
                  ("pytorch_model.bin.index.json", "pytorch_model.bin"))
# Switches in config.json that say how a model is to be run, not what it is: the runner decides them (transformers'
# default attention kernel for the family, dict outputs), so a kernel that is not installed (flash_attention_2) or
# tuple outputs cannot break it. Left out of the copied config.json (top level and sub-configs).
RUNTIME_KEYS = ("attn_implementation", "_attn_implementation", "_attn_implementation_internal",
                "experts_implementation", "_experts_implementation", "_experts_implementation_internal",
                "output_attentions", "output_hidden_states", "return_dict", "torchscript", "use_cache")


@dataclass
class Staged:
    """A private folder for transformers: `where` and the from_pretrained keywords; `shown` names the model as
    the user gave it (for messages); `tokenizer_files` what the tokenizer may read (empty: none in the folder)."""

    where: str
    kw: dict[str, Any]
    shown: Path
    config_file: Path
    tokenizer_files: list[Path] = field(default_factory=list)  # a GGUF: itself, when it has tokenizer metadata
    gguf: bool = False


@contextlib.contextmanager
def staged(resolved: Any) -> Iterator[Staged]:
    """The private folder for `resolved` (from `qkinspect.loading.resolve`), removed afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix="qkinspect-run-"))
    try:
        yield _stage(resolved, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _stage(resolved: Any, tmp: Path) -> Staged:
    path = Path(resolved.path)
    common: dict[str, Any] = {"local_files_only": True, "trust_remote_code": False}
    if resolved.format == "gguf":  # config, weights and tokenizer all come from the file the user named
        regular(path, limit=1 << 62)
        has_tokenizer = check_gguf_tokenizer(path)
        _link(tmp, path.name, Path(os.path.realpath(path)))
        return Staged(str(tmp), {**common, "gguf_file": path.name}, path, path, [path] if has_tokenizer else [],
                      gguf=True)
    folder = path if path.is_dir() else path.parent
    _copy_json(folder, "config.json", tmp)
    for name in _weight_files(resolved, folder, path):
        _link(tmp, name[1], inside(folder, name[0], folder, "weight file"))
    files = stage_tokenizer(folder, tmp)
    return Staged(str(tmp), common, path, folder / "config.json", files)


def _weight_files(resolved: Any, folder: Path, path: Path) -> list[tuple[str, str]]:
    """(name in the model folder, name in the private folder) of every weight file the model reads."""
    if not path.is_dir():  # a weight file named beside its config.json: transformers reads it under its own name
        return [(path.name, "model.safetensors" if resolved.format == "safetensors" else "pytorch_model.bin")]
    for index, single in WEIGHT_INDEXES:
        if resolved.format not in single:
            continue
        if (folder / index).is_file():
            data = read_json(inside(folder, index, folder))
            shards = data.get("weight_map") if isinstance(data.get("weight_map"), dict) else {}
            return [(index, index)] + [(s, s) for s in dict.fromkeys(shards.values())]
        if (folder / single).is_file():
            return [(single, single)]
    raise CheckpointError(f"{folder}: no {resolved.format} weights for transformers to read")


def stage_tokenizer(folder: Path, tmp: Path) -> list[Path]:
    """Check the tokenizer files of `folder` (link rules, regular files, contents) and put them into `tmp`; the
    files found (their paths in `folder`)."""
    found = []
    for name in TOKENIZER_FILES:
        if not os.path.lexists(folder / name):
            continue
        real = inside(folder, name, folder, "tokenizer file")
        regular(real, folder / name)
        found.append(folder / name)
        if name in COPIED:
            _copy_json(folder, name, tmp)
        else:
            _link(tmp, name, Path(os.path.realpath(real)))
    check_tokenizer_files(folder, [p.name for p in found])
    return found


@contextlib.contextmanager
def staged_tokenizer(folder: Path) -> Iterator[tuple[str, list[Path]]]:
    """A private folder holding the checked tokenizer files of `folder` (a --tokenizer folder), and those files."""
    tmp = Path(tempfile.mkdtemp(prefix="qkinspect-tok-"))
    try:
        yield str(tmp), stage_tokenizer(folder, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_tokenizer_files(folder: Path, names: list[str]) -> None:
    """What transformers' tokenizer classes would fail on in the files themselves, refused with the file named."""
    if "tokenizer.json" in names:
        from tokenizers import Tokenizer

        path = folder / "tokenizer.json"
        text = utf8_text(path)
        with boundary(path, "not a tokenizer the tokenizers library can read", native=True):
            Tokenizer.from_str(text)  # the tokenizers library's own parser: the one transformers uses
    if "vocab.txt" in names:
        config = read_json(folder / "tokenizer_config.json") if "tokenizer_config.json" in names else {}
        special = read_json(folder / "special_tokens_map.json") if "special_tokens_map.json" in names else {}
        cls = config.get("tokenizer_class")
        # With tokenizer.json, vocab.txt is not what the tokenizer is built from; a class other than WordPiece's
        # may need no unknown token.
        wordpiece = "tokenizer.json" not in names and (cls is None or cls in WORDPIECE_CLASSES)
        check_vocab(folder / "vocab.txt", config.get("unk_token") or special.get("unk_token"), unk=wordpiece)


# transformers' tokenizer classes built from a WordPiece vocab.txt (the fast ones too)
WORDPIECE_CLASSES = frozenset(f"{n}Tokenizer{fast}" for fast in ("", "Fast") for n in (
    "Bert", "DistilBert", "Electra", "MobileBert", "SqueezeBert", "LayoutLM", "Funnel", "Lxmert", "RetriBert",
    "MPNet", "ConvBert"))


def check_vocab(path: Path, unk_token: Any = None, unk: bool = True) -> None:
    """A vocab.txt: UTF-8 text, one token a line, of at most MAX_VOCAB tokens; for WordPiece (`unk`), holding its
    unknown token (``[UNK]`` unless the tokenizer's config names another)."""
    regular(path)
    tokens = utf8_text(path).splitlines()
    too_many_tokens(path, len(tokens))
    if not unk:
        return
    name = unk_token.get("content") if isinstance(unk_token, dict) else unk_token
    name = name if isinstance(name, str) and name else "[UNK]"
    if not any(t.strip() for t in tokens):
        raise CheckpointError(f"{path}: no tokens in this vocabulary")
    if name not in tokens and name not in (t.strip() for t in tokens):
        raise CheckpointError(f"{path}: the vocabulary has no unknown token {name!r}, which WordPiece needs")


# GGUF tokenizer metadata that names a token by its index (transformers looks each up in the token list)
GGUF_TOKEN_IDS = ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id", "seperator_token_id",
                  "mask_token_id", "cls_token_id", "eot_token_id", "eom_token_id")


def check_gguf_tokenizer(path: Path) -> bool:
    """A GGUF file's tokenizer metadata as transformers reads it: a token list that is not empty, and special
    token ids that index it; refused with the key named. False when the file has no tokenizer."""
    from qkinspect.loading.gguf import gguf_field, gguf_file_reader
    from qkinspect.loading.gguf_reader import array_length

    reader = gguf_file_reader(path)
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        return False
    n = array_length(tokens)
    if n < 1:
        raise CheckpointError(f"{path}: GGUF metadata 'tokenizer.ggml.tokens' is empty")
    for key in GGUF_TOKEN_IDS:
        value = gguf_field(reader, f"tokenizer.ggml.{key}", path, None)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
            raise CheckpointError(f"{path}: GGUF metadata 'tokenizer.ggml.{key}' is {value!r}, not one of the "
                                  f"{n} tokens' ids (0-{n - 1})")
    return True


def _copy_json(folder: Path, name: str, tmp: Path) -> None:
    path = inside(folder, name, folder)
    regular(path, folder / name)
    data = read_json(path)
    data.pop("auto_map", None)  # remote code is never run; without it transformers' own classes are chosen
    if name == "config.json":
        for d in [data, *(v for v in data.values() if isinstance(v, dict))]:
            for key in RUNTIME_KEYS:
                d.pop(key, None)
    (tmp / name).write_text(json.dumps(data), encoding="utf-8")


def _link(tmp: Path, name: str, target: Path) -> None:
    link = tmp / name
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.realpath(target), link)


@contextlib.contextmanager
def no_gguf_bar(gguf: bool) -> Iterator[None]:
    """transformers' GGUF loader draws its own tqdm bar ("Converting and de-quantizing GGUF tensors"), which
    transformers' disable_progress_bar does not reach: for the load, its module's `tqdm` is transformers' own
    (`transformers.utils.logging.tqdm`, silent while progress bars are disabled)."""
    module = None
    if gguf:
        with contextlib.suppress(ImportError):
            from transformers import modeling_gguf_pytorch_utils as module
    old = getattr(module, "tqdm", None)
    if old is None:
        yield
        return
    from transformers.utils.logging import tqdm as quiet

    module.tqdm = quiet
    try:
        yield
    finally:
        module.tqdm = old


# -- config values the runner uses ---------------------------------------------------------------------------


def check_config(config: Any, shown: Any) -> None:
    """Values transformers checks only while it builds the model (an assertion, a KeyError): refused here."""
    vocab = getattr(config, "vocab_size", None)
    pad = getattr(config, "pad_token_id", None)
    if pad is not None:
        if type(pad) is not int:
            raise CheckpointError(f"{shown}: pad_token_id is {pad!r}, not a token id")
        if type(vocab) is int and not 0 <= pad < vocab:
            raise CheckpointError(f"{shown}: pad_token_id {pad} is outside the vocabulary (0-{vocab - 1})")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = getattr(config, "rope_parameters", None)
    for params in _rope_sets(rope):
        kind = params.get("rope_type", "default")
        if kind != "default" and kind not in ROPE_INIT_FUNCTIONS:
            known = ", ".join(["default", *sorted(ROPE_INIT_FUNCTIONS)])
            raise CheckpointError(f"{shown}: rope_type {kind!r} is not one transformers knows ({known})")


def _rope_sets(rope: Any) -> list[dict]:
    if not isinstance(rope, dict):
        return []
    if all(isinstance(v, dict) for v in rope.values()) and rope:  # one set per layer type (Gemma 3)
        return list(rope.values())
    return [rope]


def check_token_ids(ids: Any, n: int, shown: Any, what: str = "the tokenizer gives") -> None:
    """Every id in `ids` indexes one of the model's `n` embedding rows; CheckpointError naming the tokenizer."""
    bad = [int(i) for i in ids if not 0 <= int(i) < n]
    if bad:
        raise CheckpointError(f"{shown}: {what} token id {bad[0]}, but the model has {n} token embeddings "
                              f"(0-{n - 1})")


__all__ = ["RUNTIME_KEYS", "Staged", "TOKENIZER_FILES", "check_config", "check_gguf_tokenizer", "check_token_ids",
           "check_tokenizer_files", "check_vocab", "no_gguf_bar", "stage_tokenizer", "staged", "staged_tokenizer"]
