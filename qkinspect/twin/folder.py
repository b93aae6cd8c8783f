"""A twin's folder, in one place: its layout, what may be given as one, and every file of it read or written.

    DIR/twin.json                          the manifest: setup, plan, resume key, failures (`FOLDER_KIND`)
    DIR/tokens/train.npy, held_out.npy     the token streams every run reads (int32), tokens/tokenizer.txt
    DIR/runs/<variant>-s<seed>-lr<lr>.json one document per finished run (`RUN_KIND`), named by `run_name`
    DIR/tracks/<run>/                      a run's head metrics (a sweep folder; --track-every)
    DIR/checkpoints/<variant>-s<seed>/     a twin's final weights (--save-checkpoints)

The folder is untrusted when it is read (one someone sent, or one a run left half written): the manifest and each
run file are read through the house's reader (`qkinspect.reading`: regular files only, bounded in size and depth),
a link or anything but a regular file among the run files is refused with one line naming it, and nothing the
twin writes goes through a link or a device in its place (such an entry is removed first, as the sweep's own
files are). What the documents hold is checked by `qkinspect.twin.saved` with `qkinspect.checking`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from qkinspect.errors import InputError
from qkinspect.names import Names

MANIFEST = "twin.json"
RUNS = "runs"
TOKENS = "tokens"
TRACKS = "tracks"
CHECKPOINTS = "checkpoints"
TRAIN, HELD_OUT, TOKENIZER = "train.npy", "held_out.npy", "tokenizer.txt"
FOLDER_KIND = "twin-folder"
RUN_KIND = "twin-run"
MAX_MANIFEST_BYTES = 64 << 20
MAX_RUN_BYTES = 256 << 20  # a run file larger than this is not one qkinspect wrote
MAX_RUNS = 1 << 16  # run files a folder may hold


def slug(variant: str) -> str:
    """A variant as a file name: `rank:8` as rank8, `share_qk+params` as share_qk-params."""
    return variant.replace(":", "").replace("+", "-")


def run_name(variant: str, seed: int, lr: float) -> str:
    """A run's file name stem: `share_qk-s0-lr0.001` (`rank:8` as rank8, `+params` as -params)."""
    return f"{slug(variant)}-s{seed}-lr{lr:g}"


def run_path(folder: Path, variant: str, seed: int, lr: float) -> Path:
    return Path(folder) / RUNS / f"{run_name(variant, seed, lr)}.json"


def token_path(folder: Path, name: str) -> Path:
    """tokens/train.npy, tokens/held_out.npy or tokens/tokenizer.txt of the folder."""
    return Path(folder) / TOKENS / name


def track_dir(folder: Path, variant: str, seed: int, lr: float) -> Path:
    return Path(folder) / TRACKS / run_name(variant, seed, lr)


def checkpoint_dir(folder: Path, variant: str, seed: int) -> Path:
    return Path(folder) / CHECKPOINTS / f"{slug(variant)}-s{seed}"


def is_twin_folder(path: Any) -> bool:
    return isinstance(path, (str, os.PathLike)) and (Path(path) / MANIFEST).is_file()


def check_out(folder: Path, names: Names) -> None:
    """InputError, before any work and without writing anything, when `folder` cannot hold the twins: a file, a
    sweep or atlas folder, or a folder holding files of something else (a twin folder resumes; a new or empty
    folder starts one)."""
    said = names.said("out", folder)
    if not os.path.lexists(folder):
        return
    if not folder.is_dir():
        raise InputError(f"{said}: not a folder")
    if os.path.lexists(folder / MANIFEST):  # a twin folder to resume (its manifest is checked with the setup)
        read_manifest(folder)
        run_files(folder)  # a link or a device among its runs is refused before any work
        return
    for other, what in (("sweep.json", "a sweep folder"), ("atlas.json", "an atlas folder")):
        if os.path.lexists(folder / other):
            raise InputError(f"{said}: {what}, not a twin folder; give the twins a new or empty folder")
    try:
        with os.scandir(folder) as entries:
            empty = next(entries, None) is None
    except OSError as e:
        raise InputError(f"{said}: cannot read the folder ({e.strerror or e})") from None
    if not empty:
        raise InputError(f"{said}: holds files but is not a twin folder (no {MANIFEST}); give the twins a new or "
                         "empty folder")


def read_manifest(folder: Path) -> dict[str, Any]:
    """twin.json, read bounded, as an object of kind `FOLDER_KIND`; InputError naming the file otherwise."""
    from qkinspect.reading import read_json

    path = Path(folder) / MANIFEST
    if not os.path.lexists(path):
        raise InputError(f"{path}: no such file (not a twin folder?)")
    if os.path.islink(path):
        raise InputError(f"{path}: is a link; a twin folder's manifest is a regular file")
    doc = read_json(path, what="a twin folder's manifest", limit=MAX_MANIFEST_BYTES)
    if not isinstance(doc, dict) or doc.get("kind") != FOLDER_KIND:
        raise InputError(f"{path}: not a twin folder's manifest (no \"kind\": \"{FOLDER_KIND}\")")
    return doc


def run_files(folder: Path) -> list[Path]:
    """The folder's run files (runs/*.json), sorted; InputError naming the first that is a link or not a regular
    file (a run file is the twin's own, never a way out of the folder)."""
    top = Path(folder) / RUNS
    if os.path.islink(top):
        raise InputError(f"{top}: is a link; a twin folder's runs are its own folder")
    if not top.is_dir():
        return []
    try:
        with os.scandir(top) as entries:
            found = sorted((e.name, e) for e in entries if e.name.endswith(".json"))
    except OSError as e:
        raise InputError(f"{top}: cannot read the folder ({e.strerror or e})") from None
    if len(found) > MAX_RUNS:
        raise InputError(f"{top}: holds {len(found)} run files; a twin folder has at most {MAX_RUNS}")
    for name, entry in found:
        if entry.is_symlink():
            raise InputError(f"{top / name}: is a link; a twin's run files are regular files in its folder")
        if not stat.S_ISREG(entry.stat(follow_symlinks=False).st_mode):
            raise InputError(f"{top / name}: not a regular file; a twin's run files are regular files")
    return [top / name for name, _ in found]


def read_run(path: Path) -> Any:
    """A run file's JSON, read bounded (its checks are the reader's: qkinspect.twin.saved)."""
    from qkinspect.reading import read_json

    if os.path.islink(path):
        raise InputError(f"{path}: is a link; a twin's run files are regular files in its folder")
    return read_json(path, what="a twin run", limit=MAX_RUN_BYTES)


def existing(folder: Path, key: str, training: dict[str, Any], text_sha: str, tokenizer_sha: str,
             names: Names) -> dict[str, Any]:
    """The folder's manifest where it was written for this setup (resumed), {} where there is none; InputError
    naming the option that differs where it holds twins of another setup."""
    if not os.path.lexists(Path(folder) / MANIFEST):
        return {}
    doc = read_manifest(folder)
    if doc.get("key") == key:
        return doc
    said = names.said("out", folder)
    theirs = doc.get("training") if isinstance(doc.get("training"), dict) else {}
    setup = doc.get("setup") if isinstance(doc.get("setup"), dict) else {}
    text = setup.get("text") if isinstance(setup.get("text"), dict) else {}
    if text.get("sha256") != text_sha:
        raise InputError(f"{said}: holds twins of another setup, trained on another text (sha256 "
                         f"{str(text.get('sha256'))[:8]}…, {names.text} is {text_sha[:8]}…); choose another folder")
    for option, here, there in _options(training, theirs):
        if here != there:
            raise InputError(f"{said}: holds twins of another setup, trained with {names.said(option, there)}, "
                             f"not {names.said(option, here)}; choose another folder or the same options")
    tok = setup.get("tokenizer") if isinstance(setup.get("tokenizer"), dict) else {}
    if tok.get("sha256") != tokenizer_sha:
        raise InputError(f"{said}: holds twins of another setup, another {names.tokenizer} (its sha256 differs: a "
                         "BPE trained by another tokenizers version?); choose another folder")
    raise InputError(f"{said}: holds twins of another setup (its resume key differs); choose another folder")


def _options(training: dict[str, Any], theirs: dict[str, Any]):
    """(option, this request's value, the folder's) for every option the resume key holds, the model's sizes
    first."""
    shape, other = training.get("shape", {}), theirs.get("shape") if isinstance(theirs.get("shape"), dict) else {}
    for k, v in shape.items():
        yield k, v, other.get(k)
    for k, v in training.items():
        if k != "shape":
            yield k, v, theirs.get(k)


def make_room(path: Path) -> None:
    """Remove whatever is at `path` that the twin did not write as a regular file or folder (a link, a FIFO, a
    device node), so nothing is written through it; InputError where it cannot be removed."""
    if not os.path.lexists(path) or (not os.path.islink(path) and (path.is_file() or path.is_dir())):
        return
    try:
        os.unlink(path)
    except OSError as e:
        raise InputError(f"{path}: cannot replace it ({e.strerror or e})") from None


def own_dir(path: Path) -> Path:
    """The folder `path` of the twin folder, created, never a link out of it."""
    make_room(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Write `doc` atomically (what is in its place removed first: `make_room`)."""
    from qkinspect.documents import json_safe
    from qkinspect.sweep.store import write_json as write

    write(path, json_safe(doc))  # the sweep's writer: a link or device in its place is removed, never written through


def write_file(path: Path, write: Callable[[IO], None], *, binary: bool = True) -> None:
    from qkinspect.files import atomic_write

    make_room(path)
    atomic_write(path, write, binary=binary)


def write_tokens(folder: Path, train, held_out, tokenizer_text: str) -> None:
    """tokens/train.npy, held_out.npy (int32) and tokenizer.txt."""
    import numpy as np

    own_dir(Path(folder) / TOKENS)
    for name, stream in ((TRAIN, train), (HELD_OUT, held_out)):
        write_file(token_path(folder, name), lambda f, s=stream: np.save(f, s.astype(np.int32)))
    write_file(token_path(folder, TOKENIZER), lambda f: f.write(tokenizer_text), binary=False)


def read_tokens(folder: Path, name: str):
    """A token stream of the folder (memory-mapped int32), refused where it is a link or not a regular file."""
    import numpy as np

    path = token_path(folder, name)
    if os.path.islink(path) or not path.is_file():
        raise InputError(f"{path}: not a regular file; the twin folder's token streams are its own")
    return np.load(path, mmap_mode="r", allow_pickle=False)
