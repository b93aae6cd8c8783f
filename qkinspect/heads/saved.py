"""The checked reader of a heads document (`qkinspect heads -o FILE.json`): read back through the house's bounded
reader (`qkinspect.reading`) as untrusted input, returning the same `HeadsResult` the library computes.

Example:
    >>> result = read("heads.json")  # doctest: +SKIP
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from qkinspect.behaviour import SCORES
from qkinspect.documents import SCHEMA, model_info
from qkinspect.errors import InputError
from qkinspect.heads.results import HEADS_KIND, SCOPES, HeadsRecord, HeadsResult, HeadsSettings, RelationRecord
from qkinspect.reading import declares_kind, read_json

WHAT = "a heads document"


def is_heads(spec: Any) -> bool:
    """Whether `spec` names a .json file whose head says it is a heads document (its first 4 KiB only)."""
    return declares_kind(spec, HEADS_KIND)


def read(path: str | Path) -> HeadsResult:
    """A heads document read back, checked as untrusted input.

    Raises:
        InputError: naming the file and the field, for anything that is not such a document.
    """
    path = Path(path)
    doc = read_json(path, what=WHAT)
    try:
        return _from_dict(doc)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise InputError(f"{path}: not a valid heads document ({type(e).__name__}: {e})") from None


def _num(v: Any, field: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{field}: {v!r} is not a number")
    return float(v)


def _int(v: Any, field: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{field}: {v!r} is not a whole number")
    return v


def _from_dict(doc: Any) -> HeadsResult:
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("kind") != HEADS_KIND:
        got = (doc.get("schema"), doc.get("kind")) if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"schema/kind {got!r}: expected {SCHEMA}, {HEADS_KIND}")
    info = model_info(doc["model"])
    raw = {"fold_qk_norm": False, **doc["settings"]}  # documents written before the option had no fold
    known = HeadsSettings.__dataclass_fields__
    settings = HeadsSettings(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in known})
    spec = info.blocks[0]
    for what, size in (("layers", spec.n_layers), ("heads", spec.n_heads)):  # the selection (None: every head)
        chosen = getattr(settings, what)
        if chosen is not None and not all(not isinstance(i, bool) and isinstance(i, int) and 0 <= i < size
                                          for i in chosen):
            raise ValueError(f"settings.{what}: {list(chosen)!r} is not a selection of this model's {what}")
    records = []
    for i, r in enumerate(doc["heads"]):
        layer, head, kv = (_int(r[k], f"heads[{i}].{k}") for k in ("layer", "head", "kv_head"))
        if not (0 <= layer < spec.n_layers and 0 <= head < spec.n_heads and 0 <= kv < spec.n_kv_heads):
            raise ValueError(f"heads[{i}]: layer {layer} head {head} kv_head {kv} is not a head of this model")
        scores = {s: _num(r.get(s), f"heads[{i}].{s}") for s in SCORES}
        errors = {s: _num(r.get(f"{s}_se"), f"heads[{i}].{s}_se") for s in SCORES}
        weights = {m: _num(r.get(m), f"heads[{i}].{m}") for m in settings.metrics}
        records.append(HeadsRecord(spec.key, layer, head, kv, scores, errors, weights))
    relations = []
    for i, r in enumerate(doc.get("relations", [])):
        if r["scope"] not in SCOPES or r["score"] not in SCORES:
            raise ValueError(f"relations[{i}]: scope {r['scope']!r} or score {r['score']!r} unknown")
        layer = None if r.get("layer") is None else _int(r["layer"], f"relations[{i}].layer")
        relations.append(RelationRecord(str(r["metric"]), r["score"], r["scope"], layer,
                                        *(_num(r.get(k), f"relations[{i}].{k}") for k in ("rho", "low", "high", "p")),
                                        _int(r["n"], f"relations[{i}].n")))
    seconds = {str(k): float(v) for k, v in doc.get("seconds", {}).items()}
    processing = doc.get("processing", {})
    if not isinstance(processing, dict):
        raise ValueError("processing is not an object")
    return HeadsResult(info, settings, records, relations, [str(w) for w in doc.get("warnings", [])], seconds,
                       processing)

# The two verbs every capability's saved module offers (qkinspect.capabilities): read one back, and whether a
# model argument is one of its own. The names above stay, as they were published.
is_saved = is_heads
