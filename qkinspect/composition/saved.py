"""The checked reader of a composition document (`qkinspect composition -o FILE.json`): read back as untrusted
input, returning the same `CompositionResult` the library computes. Read as every saved document is
(qkinspect.reading: a regular file, bounded in size and depth, one line naming the file); numpy and the records are
imported on reading, so that `plot` and `report` ask `is_composition_document` of any model argument for free.

Example:
    >>> result = read_composition("composition.json")  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qkinspect.errors import InputError
from qkinspect.reading import declares_kind, read_json

if TYPE_CHECKING:
    from qkinspect.composition.results import CompositionResult


def is_composition_document(spec: str | Path) -> bool:
    """Whether `spec` names a JSON file whose head says it is a composition document (read no further)."""
    return declares_kind(spec, "composition")


def read_composition(path: str | Path) -> CompositionResult:
    """A composition document (`qkinspect composition -o FILE.json`) read back, checked as untrusted input.

    Raises:
        InputError: naming the file, for anything that is not such a document.
    """
    path = Path(path)
    doc = read_json(path, what="a composition document")
    try:
        return _from_dict(doc)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise InputError(f"{path}: not a valid composition document ({type(e).__name__}: {e})") from None


def _from_dict(doc: Mapping[str, Any]) -> CompositionResult:
    import numpy as np

    from qkinspect.composition.results import BY, KIND_TEXT, BlockPair, CompositionResult
    from qkinspect.documents import SCHEMA, model_info
    from qkinspect.processing import CompositionProcessing

    if doc.get("schema") != SCHEMA or doc.get("kind") != "composition":
        raise ValueError(f"schema {doc.get('schema')!r}, kind {doc.get('kind')!r}: expected {SCHEMA}, composition")
    info = model_info(doc["model"])
    proc = {k: tuple(v) if isinstance(v, list) else v for k, v in doc["processing"].items()
            if k in CompositionProcessing.__dataclass_fields__}
    pairs = [BlockPair(str(p["from_block"]), str(p["to_block"]), tuple(map(str, p["kinds"])), int(p["width"]),
                       str(p["rule"])) for p in doc["pairs"]]
    processing = CompositionProcessing(**proc)
    if processing.by not in BY:
        raise ValueError(f"processing.by is {processing.by!r}, not one of {', '.join(BY)}")
    by_kv = processing.by == "kv-head"
    shapes = {b.key: b.n_heads for b in info.blocks}
    later = {b.key: b.n_kv_heads if by_kv else b.n_heads for b in info.blocks}
    scores: dict[tuple, np.ndarray] = {}
    one_block = info.blocks[0].key if len(info.blocks) == 1 else None
    for r in doc["records"]:
        fb, tb = str(r.get("from_block", one_block)), str(r.get("to_block", one_block))
        key = (fb, int(r["from_layer"]), tb, int(r["to_layer"]), str(r["kind"]))
        if key not in scores:
            scores[key] = np.full((shapes[fb], later[tb]), np.nan)
        a, b, v = int(r["from_head"]), int(r["to_kv_head" if by_kv else "to_head"]), r["score"]
        if key[4] not in KIND_TEXT or not (0 <= a < shapes[fb] and 0 <= b < later[tb]):
            raise ValueError(f"record {r!r} names a kind or head this model does not have")
        scores[key][a, b] = np.nan if v is None else float(v)
    norms = {}
    for n in doc.get("read_norms", []):
        b = str(n["block"])
        v = np.asarray([np.nan if x is None else float(x) for x in n["norms"]], dtype=np.float64)
        if str(n["kind"]) not in KIND_TEXT or v.shape != (shapes[b],):
            raise ValueError(f"read_norms of {b} layer {n['layer']} ({n['kind']}): not {shapes[b]} head norms")
        norms[(b, int(n["layer"]), str(n["kind"]))] = v
    return CompositionResult(info, processing, pairs, scores, list(doc.get("warnings", [])), norms)

# The two verbs every capability's saved module offers (qkinspect.capabilities): read one back, and whether a
# model argument is one of its own. The names above stay, as they were published.
read = read_composition
is_saved = is_composition_document
