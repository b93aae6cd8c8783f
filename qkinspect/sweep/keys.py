"""What names a sweep's result: its kind, the analysis options that change the numbers (normalised), the result key
they give with the checkpoint's identity, and a failure record. Shared by the folder's writer (`store`) and its
checked reader (`verify`), which import it and not each other's internals.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from qkinspect.errors import InputError
from qkinspect.selection import as_indexes
from qkinspect.sweep.checkpoints import Checkpoint

RESULT_KIND = "sweep-result"
OPTION_NAMES = ("layers", "heads", "blocks", "metrics", "precision", "fold_ln", "fold_qk_norm", "layer_form")
# Options stored only when given (so the keys and folders of runs without them stay as they were): the atlas's
# behaviour scores (qkinspect.atlas.behaviour: the heads' amounts, a dict).
OPTIONAL_NAMES = ("behaviour",)


@dataclass(frozen=True)
class Failure:
    """A checkpoint the sweep could not analyse, after the engine's retry."""

    name: str
    error: str


def normalized_options(options: dict[str, Any]) -> dict[str, Any]:
    """The options that change the numbers, JSON-ready, every name present. A selection is stored as what it
    selects, whatever form it was given in: layers and heads ("0-5", "0,2,4", 3, [0, 1], range(6)) as the sorted
    list of their indexes, blocks ("decoder" or a list of names) as a list of names; None for all."""
    unknown = set(options) - set(OPTION_NAMES) - set(OPTIONAL_NAMES)
    if unknown:
        raise InputError(f"sweep: unknown analysis options {', '.join(sorted(unknown))}")
    defaults = {"precision": "float32", "fold_ln": False, "fold_qk_norm": False, "layer_form": False}
    merged = {name: options.get(name, defaults.get(name)) for name in OPTION_NAMES}
    for name in ("layers", "heads"):
        chosen = as_indexes(merged[name], name)
        merged[name] = None if chosen is None else list(chosen)
    blocks = merged["blocks"]
    merged["blocks"] = None if blocks is None else [blocks] if isinstance(blocks, str) else [str(b) for b in blocks]
    extra = {name: options[name] for name in OPTIONAL_NAMES if options.get(name)}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in {**merged, **extra}.items()}


def result_key(ck: Checkpoint, options: dict[str, Any]) -> str:
    return stored_key(ck, normalized_options(options))


def stored_key(ck: Checkpoint, stored: dict[str, Any]) -> str:
    """The key of `ck` with the options exactly as a folder stores them: `result_key`'s, for a folder this version
    wrote; for one written before selections were stored as indexes ("0-1" as text), the key its writer gave."""
    text = json.dumps({"checkpoint": ck.identity, "options": stored}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
