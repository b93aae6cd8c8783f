"""Which checkpoints a sweep covers, and the training step of each.

SPECs are folders, weight files, globs (`runs/*/checkpoint-*`) and hub ids; with `revisions` every hub id stands for
one checkpoint per revision. A checkpoint's step is `trainer_state.json`'s `global_step`, else a number in its name
(`checkpoint-1000`, `step1000`, `global_step1000`, a revision `step1000`); when some checkpoint has neither, every
step is the checkpoint's position in the sweep instead, so steps never mix two scales.

Example:
    >>> cks = discover(["runs/*/checkpoint-*"])  # doctest: +SKIP
    >>> [(c.name, c.step) for c in cks]  # doctest: +SKIP
    [('runs/a/checkpoint-500', 500), ('runs/a/checkpoint-1000', 1000)]
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from qkinspect.errors import CheckpointError, InputError, ModelNotFoundError
from qkinspect.reading import read_json

_STEP_NAME = re.compile(r"(?:checkpoint|global_step|step)[-_]?(\d+)$", re.IGNORECASE)
_GLOB = re.compile(r"[*?\[]")
_WEIGHTS = (".safetensors", ".bin", ".gguf", ".pt", ".pth")
# The files whose sizes and times stand for a local checkpoint's content in its identity.
_CONTENT = ("config.json", "*.safetensors", "*.bin", "*.gguf", "*.index.json")
TRAINER_STATE = "trainer_state.json"
MAX_TRAINER_STATE = 64 << 20  # bytes; trainer_state.json grows with log_history, but not beyond this


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of a sweep: `spec` and `revision` as `qkinspect.analyze` takes them, a display `name`,
    its `step` and where the step came from (`trainer_state`, `name` or `order`), and an `identity` that changes
    when the checkpoint does (the resolved path with its files' sizes and times, or the hub id and revision)."""

    spec: str
    revision: str | None
    name: str
    identity: str
    step: int = 0
    step_source: str = "order"

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def discover(specs: Iterable[str], revisions: Iterable[str] | None = None,
             option: str = "revisions") -> list[Checkpoint]:
    """The checkpoints named by `specs` (globs expanded in natural order, duplicates dropped), with steps, sorted by
    step when every checkpoint has one, else in the order given. `option` names `revisions` in errors as the
    caller does ("--revisions" from the CLI).

    Raises:
        InputError: a spec that names nothing, a glob that matches nothing, revisions for a local path, no specs.
    """
    revs = [r for r in (revisions or []) if r]
    found: dict[str, Checkpoint] = {}
    for spec in specs:
        for ck in _expand(str(spec), revs, option):
            found.setdefault(ck.identity, ck)
    if not found:
        raise InputError("sweep: no checkpoints given")
    return with_steps(list(found.values()))


def with_steps(checkpoints: list[Checkpoint]) -> list[Checkpoint]:
    """Steps read from each checkpoint; if any has none, every step is its position instead."""
    read = [_read_step(c) for c in checkpoints]
    if all(r is not None for r in read):
        stepped = [dataclasses.replace(c, step=r[0], step_source=r[1]) for c, r in zip(checkpoints, read, strict=True)]
        return sorted(stepped, key=lambda c: c.step)  # stable: equal steps keep the given order
    return [dataclasses.replace(c, step=i, step_source="order") for i, c in enumerate(checkpoints)]


def _expand(spec: str, revisions: list[str], option: str) -> list[Checkpoint]:
    from qkinspect.loading.resolve import is_hub_id

    path = Path(spec).expanduser()
    if revisions:
        if path.exists() or not is_hub_id(spec):
            raise InputError(f"{option} applies to hub ids (org/name), not to {spec}")
        return [Checkpoint(spec, r, f"{spec}@{r}", f"hub:{spec}@{r}") for r in revisions]
    if _GLOB.search(spec):
        matches = [Path(p) for p in sorted(glob.glob(str(path)), key=natural_key)]
        matches = [p for p in matches if p.is_dir() or p.suffix.lower() in _WEIGHTS]
        if not matches:
            raise ModelNotFoundError(f"{spec}: the pattern matches no checkpoint folder or weight file")
        return [_local(str(p), p) for p in matches]
    if path.exists():
        return [_local(spec, path)]
    if is_hub_id(spec):
        return [Checkpoint(spec, None, spec, f"hub:{spec}@")]
    raise ModelNotFoundError(f"{spec}: no such file or folder")


def _local(name: str, path: Path) -> Checkpoint:
    # The spec the workers open is absolute: a result records the model's source as opened, and is checked against
    # the checkpoint's path when the folder is read, perhaps from another working folder (sweep.verify).
    return Checkpoint(str(path.absolute()), None, name, f"{path.resolve()}#{_fingerprint(path)}")


def _fingerprint(path: Path) -> str:
    """A short digest of the names, sizes and modification times of the checkpoint's config and weight files:
    a checkpoint rewritten in place gets a new identity, so its old result is not reused."""
    folder = path if path.is_dir() else path.parent
    files = [path] if path.is_file() else []
    files += [f for pattern in _CONTENT for f in sorted(folder.glob(pattern)) if f.is_file()]
    if path.is_file():
        files = [f for f in files if f == path or f.name == "config.json" or f.name.endswith(".index.json")]
    stats = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in dict.fromkeys(files)]
    return hashlib.sha256(json.dumps(stats).encode()).hexdigest()[:12]


def _read_step(ck: Checkpoint) -> tuple[int, str] | None:
    if ck.revision is not None:
        return _step_from_name(ck.revision)
    path = Path(ck.spec)
    if ck.identity.startswith("hub:"):
        return _step_from_name(ck.spec.rsplit("/", 1)[-1])
    folder = path if path.is_dir() else path.parent
    state = _trainer_step(folder / TRAINER_STATE)
    if state is not None:
        return state, "trainer_state"
    names = [path.name] if path.is_dir() else [path.stem, folder.name]
    return next((s for s in map(_step_from_name, names) if s is not None), None)


def _step_from_name(name: str) -> tuple[int, str] | None:
    m = _STEP_NAME.search(name)
    return (int(m.group(1)), "name") if m else None


def _trainer_step(path: Path) -> int | None:
    """`global_step` of a transformers Trainer's trainer_state.json; CheckpointError naming the file when it is
    there but unreadable, not JSON, or its global_step is not a non-negative integer."""
    if not path.is_file():
        return None
    state = read_json(path, what="a trainer state", limit=MAX_TRAINER_STATE, error=CheckpointError)
    step = state.get("global_step") if isinstance(state, dict) else None
    if step is None:
        return None
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"{path}: global_step {step!r} is not a non-negative integer")
    return step


def natural_key(text: str) -> list:
    """Sort key putting `checkpoint-500` before `checkpoint-1000`."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]
