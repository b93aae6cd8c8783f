"""A sweep's folder: one result file per checkpoint, and a manifest.

    DIR/sweep.json                          the last sweep run here: options, checkpoints (with steps and result
                                            keys), failures
    DIR/results/<name>.<key>.json           one checkpoint's analysis, written atomically when it arrives

A result's key is a digest of the checkpoint's identity and the options that change the numbers (selection, metrics,
precision, folds, layer form), so a re-run with the same options finds it and skips the checkpoint, and a run with
other options computes its own. Where it ran (device, worker, threads) is recorded but is not part of the key.

Example:
    >>> sweep = read_sweep(Path("runs/sweep"))  # doctest: +SKIP
    >>> rows = sweep.rows(by="head")            # one dict per (checkpoint, step, block, layer, head)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qkinspect.errors import InputError, OutputError
from qkinspect.files import atomic_write
from qkinspect.notebook import Tabular
from qkinspect.reading import read_json
from qkinspect.sweep.checkpoints import Checkpoint
from qkinspect.sweep.keys import RESULT_KIND, Failure, normalized_options, result_key
from qkinspect.sweep.verify import ResultRefused, check_manifest, check_result

MANIFEST = "sweep.json"
RESULTS = "results"


@dataclass
class SweepResult(Tabular):
    """What a sweep folder holds for its last sweep: options, checkpoints in step order, the results found (by
    checkpoint identity) and the failures recorded. In a notebook it shows `qkinspect sweep`'s table, and
    `to_pandas()` is its tidy rows per head (qkinspect.notebook). `document()` is what `qkinspect sweep -o
    FILE.json` and `save("x.json")` write."""

    PARQUET = True

    folder: Path
    options: dict[str, Any]
    checkpoints: list[Checkpoint]
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)

    def rows(self, by: str = "head") -> list[dict[str, Any]]:
        """The tidy table: a row per (checkpoint, step, block, layer, head), or per layer with by="layer"."""
        if by not in ("head", "layer"):
            raise InputError(f"by={by!r}: expected head or layer")
        out = []
        for ck in self.checkpoints:
            doc = self.results.get(ck.identity)
            if doc is None:
                continue
            for r in doc["result"]["heads" if by == "head" else "layers"]:
                row = {k: v for k, v in r.items() if k != "head_overlap"}  # a matrix, kept in the result file
                out.append({"checkpoint": ck.name, "step": ck.step, **row})
        return out

    def table_rows(self) -> list[dict[str, Any]]:
        """The tidy rows per head (`rows()`)."""
        return self.rows()

    def document(self, by: str = "head") -> dict[str, Any]:
        """The JSON document `qkinspect sweep -o FILE.json` writes (`save(path)` writes it, per head): the sweep's
        options, checkpoints, failures and the rows (as "heads" or, by="layer", "layers")."""
        from qkinspect.documents import envelope

        return envelope("sweep", folder=str(self.folder), options=self.options,
                        checkpoints=[c.as_dict() for c in self.checkpoints],
                        failures=[{"checkpoint": f.name, "error": f.error} for f in self.failures],
                        **{"heads" if by == "head" else "layers": self.rows(by=by)})

    def render_table(self, console) -> None:
        """`qkinspect sweep`'s table of this folder."""
        from qkinspect.terminal.sweep import render_sweep

        render_sweep(console, self.rows())


def result_path(folder: Path, ck: Checkpoint, key: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", ck.name).strip("._")[-80:] or "checkpoint"
    return folder / RESULTS / f"{slug}.{key}.json"


def load_result(folder: Path, ck: Checkpoint, key: str, options: dict[str, Any]) -> dict[str, Any] | None:
    """The stored result of `ck` with `options` (its file under `key`), checked whole and against the checkpoint
    and options it claims (sweep.verify); None when there is no file.

    Raises:
        InputError (verify.ResultRefused): the file is there but is not that result: a link, a FIFO or a device,
            unreadable or invalid JSON, a schema error, or the result of another checkpoint or other options.
    """
    path = result_path(folder, ck, key)
    if not os.path.lexists(path):
        return None
    if os.path.islink(path):
        raise ResultRefused(f"{path}: is a link; a sweep's results are regular files")
    return check_result(read_json(path, what="a sweep result", error=ResultRefused), path, ck, key,
                        normalized_options(options))


def result_document(ck: Checkpoint, key: str, options: dict[str, Any], payload: dict[str, Any],
                    device: str) -> dict[str, Any]:
    from qkinspect.documents import SCHEMA
    from qkinspect.version import __version__

    return {"schema": SCHEMA, "kind": RESULT_KIND, "tool": {"name": "qkinspect", "version": __version__},
            "key": key, "checkpoint": ck.as_dict(), "options": normalized_options(options), "device": device,
            **payload}


def check_folder(folder: Path) -> None:
    """Fail with one line, before any work and without creating anything, when `folder` cannot be the sweep's."""
    existing = next(p for p in (folder, *folder.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise OutputError(f"{folder}: {existing} is not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputError(f"{folder}: {existing} is not writable")


def prepare(folder: Path) -> None:
    """Create the folder (and results/) or fail with one line when it cannot be written."""
    try:
        (folder / RESULTS).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{folder}: cannot create the sweep folder ({e.strerror or e})") from None
    if not os.access(folder / RESULTS, os.W_OK | os.X_OK):
        raise OutputError(f"{folder}: the sweep folder is not writable")


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Write `doc` atomically (a temporary file beside `path`, then a rename, as the CLI writes -o): a reader, or a
    resumed sweep, sees the whole file or none. Whatever else is at `path` (a link, a FIFO, a device node: not
    something qkinspect wrote) is removed first, never written through: the sweep's files are its own."""
    if os.path.lexists(path) and (os.path.islink(path) or not path.is_file()):
        try:
            if path.is_dir() and not path.is_symlink():
                raise OutputError(f"{path}: is a folder; the sweep writes a file there")
            os.unlink(path)
        except OSError as e:
            raise OutputError(f"{path}: cannot replace it ({e.strerror or e})") from None
    atomic_write(path, lambda f: f.write(json.dumps(doc, allow_nan=False) + "\n"))


def write_manifest(folder: Path, checkpoints: list[Checkpoint], options: dict[str, Any],
                   failures: list[Failure] = ()) -> None:
    from qkinspect.documents import SCHEMA
    from qkinspect.version import __version__

    cks = [{**ck.as_dict(), "key": (key := result_key(ck, options)),
            "file": str(result_path(folder, ck, key).relative_to(folder))} for ck in checkpoints]
    write_json(folder / MANIFEST, {
        "schema": SCHEMA, "kind": "sweep", "tool": {"name": "qkinspect", "version": __version__},
        "options": normalized_options(options), "checkpoints": cks,
        "failures": [{"checkpoint": f.name, "error": f.error} for f in failures]})


def is_sweep_folder(spec: object) -> bool:
    """Whether a model argument names a sweep folder (one holding a sweep.json) rather than a checkpoint."""
    return isinstance(spec, (str, Path)) and (Path(spec) / MANIFEST).is_file()


def read_sweep(folder: Path) -> SweepResult:
    """The last sweep recorded in `folder` with the results found there.

    Raises:
        InputError: no sweep.json (not a sweep folder), one that is not a sweep manifest (checked whole:
            sweep.verify), or a result file there that is not the result it is filed as.
    """
    folder = Path(folder)
    path = folder / MANIFEST
    if not os.path.lexists(path):
        raise InputError(f"{folder}: not a sweep folder (no {MANIFEST}; run `qkinspect sweep ... --out {folder}`)")
    cks, options, failures = check_manifest(read_json(path, what="a sweep manifest"), path)
    results = {}
    for ck, key in cks:
        stored = load_result(folder, ck, key, options)
        if stored is not None:
            results[ck.identity] = stored
    return SweepResult(folder, options, [ck for ck, _ in cks], results, failures)

# The two verbs every capability's saved module offers (qkinspect.capabilities): read one back, and whether a
# model argument is one of its own. The names above stay, as they were published.
read = read_sweep
is_saved = is_sweep_folder

# Deprecated: its name before results were named <Capability>Result (kept: users import it; docs/notebook.md).
SweepFolder = SweepResult
