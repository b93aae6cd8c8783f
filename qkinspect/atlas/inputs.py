"""Which models an atlas covers: the models named, the lines of a file (`from_file`, the CLI's `--from`), and every
model the local Hugging Face cache holds (`hf_cache`, the CLI's `--hf-cache`). Errors name these options as the
caller spells them (`qkinspect.names`).

A MODEL is anything `analyze` opens (a folder, a weight file, a GGUF file, a hub id: from the local cache when
there is no network, a glob of folders) or a saved analysis (`qkinspect analyze -o run.json`), which enters the
atlas as it was saved: nothing is recomputed. A model named twice (the same resolved files) is one entry.

Example:
    >>> found = entries(["./bert", "run.json"], from_file="models.txt")  # doctest: +SKIP
    >>> [e.name for e in found]  # doctest: +SKIP
    ['./bert', 'run.json', 'HuggingFaceTB/SmolLM2-135M']
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qkinspect.errors import InputError, said
from qkinspect.names import Names
from qkinspect.reading import read_bytes
from qkinspect.sweep.checkpoints import Checkpoint, discover
from qkinspect.sweep.names import LIBRARY_NAMES

MAX_LIST_BYTES = 4 << 20  # a list of models (from_file): one model a line


@dataclass(frozen=True)
class SavedEntry:
    """A saved analysis given as a model: its file, and the name its records go by (the path as given)."""

    path: Path
    name: str


def entries(models: list[str] | tuple[str, ...] = (), *, from_file: str | Path | None = None,
            hf_cache: bool = False, names: Names = LIBRARY_NAMES) -> list[Checkpoint | SavedEntry]:
    """The entries in the order given: models to analyse (as sweep checkpoints) and saved analyses to take as
    they are; a model or file named twice is one entry. `names`: how errors name the options (the CLI passes
    its own).

    Raises:
        InputError: no models at all, a model that names nothing, an unreadable `from_file`, an HF cache that
            cannot be scanned.
    """
    from qkinspect.analysis.saved import is_saved

    specs = [str(m) for m in models]
    if from_file is not None:
        specs += read_list(Path(from_file), names.from_file)
    if hf_cache:
        specs += hf_cache_models(option=names.hf_cache)
    if not specs:
        raise InputError(f"atlas: no models given ({names.models}, {names.from_file} or {names.hf_cache})")
    found: dict[str, Checkpoint | SavedEntry] = {}
    for spec in specs:
        if is_saved(spec):
            found.setdefault(f"saved:{Path(spec).resolve()}", SavedEntry(Path(spec), spec))
            continue
        for ck in discover([spec]):
            found.setdefault(ck.identity, ck)
    return list(found.values())


def read_list(path: Path, option: str = "from_file") -> list[str]:
    """The models a file names: one a line; blank lines and lines starting with # are skipped. `option` names
    the file in errors as the caller does ("--from" from the CLI)."""
    raw = read_bytes(path, what="a list of models", limit=MAX_LIST_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{said(option, str(path))}: not UTF-8 text (byte {e.start})") from None
    lines = [line.strip() for line in text.splitlines()]
    for n, line in enumerate(lines, start=1):
        bad = next((c for c in line if not c.isprintable() and c != "\t"), None)
        if bad is not None:
            raise InputError(f"{said(option, str(path))}: line {n} holds the control character {bad!r}; a model is "
                             "named by printable text, one a line")
    models = [line for line in lines if line and not line.startswith("#")]
    if not models:
        raise InputError(f"{said(option, str(path))}: names no model (one a line; # starts a comment)")
    return models


def hf_cache_models(cache_dir: str | Path | None = None, option: str = "hf_cache") -> list[str]:
    """The repo ids of every model the local Hugging Face cache holds (huggingface_hub.scan_cache_dir), sorted;
    the cache is HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub (read when called). `option`
    names the request in errors as the caller does ("--hf-cache" from the CLI).

    Raises:
        InputError: no cache there, or it cannot be scanned; a cache that holds no model.
    """
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    from qkinspect.loading.resolve import hub_cache_dir

    cache = Path(cache_dir) if cache_dir is not None else hub_cache_dir()
    try:
        info = scan_cache_dir(cache)
    except CacheNotFound:
        raise InputError(f"{option}: no Hugging Face cache at {cache} (set HF_HUB_CACHE or HF_HOME)") from None
    except (OSError, ValueError) as e:
        raise InputError(f"{option}: cannot scan the Hugging Face cache at {cache} ({e})") from None
    ids = sorted(r.repo_id for r in info.repos if r.repo_type == "model")
    if not ids:
        raise InputError(f"{option}: the Hugging Face cache at {cache} holds no model")
    return ids
