"""An atlas's folder: the models' analyses (a sweep folder), the saved analyses taken in, and a manifest.

    DIR/atlas.json                    the last atlas run here: options, entries in order (name, kind, file), failures
    DIR/models/                       a sweep folder (qkinspect.sweep): one analysis per model, written as it arrives
    DIR/saved/<name>.<digest>.json    each saved analysis given as a model, as it was read (checked) from its file

Everything an atlas shows (records, facts, figures) is computed from these files when the folder is read
(`read_atlas`), so `plot DIR` and `report DIR` need nothing else. Each file is checked where it enters: the manifest
here, the models' analyses by the sweep's checks (qkinspect.sweep.verify), the saved analyses by qkinspect.saved.

Example:
    >>> atlas = read_atlas("atlas/")  # doctest: +SKIP
    >>> atlas.to_pandas().query("metric == 'symmetry' and scope == 'model'")  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

from qkinspect.checking import Checker, show
from qkinspect.errors import InputError
from qkinspect.reading import read_json
from qkinspect.sweep.keys import Failure

MANIFEST = "atlas.json"
MODELS = "models"
SAVED = "saved"
KIND = "atlas"
ENTRY_KINDS = ("model", "saved")
MAX_ENTRIES = 1 << 16


def is_atlas(path: object) -> bool:
    """Whether a model argument names an atlas folder (one holding atlas.json)."""
    return path is not None and isinstance(path, (str, Path)) and (Path(path) / MANIFEST).is_file()


def check_out(folder: Path, option: str = "out") -> None:
    """InputError, before any work and without writing anything, when `folder` is not empty and is not an atlas
    folder: a sweep folder (whose `report` would then show the atlas and hide the sweep) or anything else. `option`
    names the folder as the caller does (the CLI's --out)."""
    from qkinspect.errors import said

    if not folder.is_dir() or is_atlas(folder):
        return  # a new folder, or an atlas to resume (a path that is no folder is the sweep's check_folder's)
    if (folder / "sweep.json").exists():
        raise InputError(f"{said(option, str(folder))}: a sweep folder, not an atlas folder; give the atlas a new or "
                         "empty folder")
    try:
        empty = next(os.scandir(folder), None) is None
    except OSError as e:
        raise InputError(f"{said(option, str(folder))}: cannot read the folder ({e.strerror or e})") from None
    if not empty:
        raise InputError(f"{said(option, str(folder))}: holds files but is not an atlas folder (no {MANIFEST}); give "
                         "the atlas a new or empty folder")


def saved_path(folder: Path, name: str, doc_text: str) -> Path:
    """Where a saved analysis is kept in the atlas folder: its name made safe, and a digest of its content."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")[-80:] or "analysis"
    return folder / SAVED / f"{slug}.{hashlib.sha256(doc_text.encode()).hexdigest()[:16]}.json"


def write_manifest(folder: Path, options: dict[str, Any], entries: list[dict[str, str]],
                   failures: list[Failure] = ()) -> None:
    """atlas.json: `entries` as {"name", "entry": "model"|"saved", "file" (saved: relative to the folder)}."""
    from qkinspect.documents import envelope
    from qkinspect.sweep.store import write_json

    write_json(folder / MANIFEST, envelope(KIND, options=options, entries=entries,
                                           failures=[{"model": f.name, "error": f.error} for f in failures]))


def read_manifest(folder: Path) -> tuple[dict[str, Any], list[dict[str, str]], list[Failure]]:
    """(options, entries, failures) of the folder's atlas.json, checked whole; InputError naming the file and the
    key otherwise."""
    path = folder / MANIFEST
    if not os.path.lexists(path):
        raise InputError(f"{folder}: not an atlas folder (no {MANIFEST}; run `qkinspect atlas ... --out {folder}`)")
    doc = read_json(path, what="an atlas manifest")
    c = Checker(path)
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise InputError(f"{path}: not a qkinspect atlas manifest (no \"kind\": \"{KIND}\")")
    options = c.obj(doc.get("options"), "options")
    items = doc.get("entries")
    if not isinstance(items, list) or len(items) > MAX_ENTRIES:
        raise c.fail("entries", f"is {show(items)}, not a list of entries")
    entries = []
    for i, item in enumerate(items):
        where = f"entries[{i}]"
        item = c.obj(item, where)
        name = c.text(item.get("name"), f"{where}.name")
        kind = item.get("entry")
        if kind not in ENTRY_KINDS:
            raise c.fail(f"{where}.entry", f"is {show(kind)}, not one of {', '.join(ENTRY_KINDS)}")
        file = c.text(item.get("file"), f"{where}.file", null=kind == "model")
        if kind == "saved" and not _inside(file, SAVED):
            raise c.fail(f"{where}.file", f"is {show(file)}, not a file under {SAVED}/ of the atlas folder")
        entries.append({"name": name, "entry": kind, "file": file})
    failures = doc.get("failures", [])
    if not isinstance(failures, list) or len(failures) > MAX_ENTRIES:
        raise c.fail("failures", f"is {show(failures)}, not a list")
    fails = [Failure(c.text(c.obj(f, f"failures[{i}]").get("model"), f"failures[{i}].model"),
                     c.text(f.get("error"), f"failures[{i}].error")) for i, f in enumerate(failures)]
    return options, entries, fails


def _inside(file: str, top: str) -> bool:
    """A relative path of the form top/NAME (one level, no '..', no separators in NAME)."""
    parts = file.split("/")
    return len(parts) == 2 and parts[0] == top and parts[1] not in ("", ".", "..") and "\\" not in parts[1] \
        and not parts[1].startswith(".")
