"""A saved analysis read back: the JSON `qkinspect analyze -o run.json` writes (schema qkinspect/1, "kind":
"analyze") as the AnalysisResult it was made from, so that `plot` and `report` draw from it without the model.

The file is untrusted input like any other: read through the house's reader (qkinspect.reading: a regular file,
bounded in size and depth), every field checked for its type and range
(heads and layers within the shapes the file itself declares) before a record is built, and anything else refused
with one line naming the file and the field (InputError). What the JSON does not keep is said where it is needed:
it has no singular-value spectra (the `spectra` figure needs the model), and it has head-by-head overlaps and the
shared-QK distance only when analyze measured them.

Example:
    >>> result = read_saved("run.json")  # doctest: +SKIP
    >>> figure(result, "symmetry").savefig("symmetry.png")  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qkinspect.analysis.results import ANALYSIS_KIND, AnalysisResult, Baseline, HeadRecord, LayerRecord
from qkinspect.documents import SCHEMA, model_info
from qkinspect.errors import InputError
from qkinspect.limits import MAX_METRIC
from qkinspect.processing import Processing
from qkinspect.reading import read_json

MAX_BYTES = 256 << 20  # a 70B model's every head and head-by-head overlap is a few MB; more is not a saved analysis
MAX_DEPTH = 16  # nesting the document has (head_overlap: 5 levels)
# Layers × heads a block may declare: figures hold one value per (layer, head), so a file declaring 10⁶ × 10⁶
# with a record on the diagonal would ask for terabytes; the largest models have ~10⁴ (128 layers × 128 heads).
MAX_GRID = 1 << 20
KIND = ANALYSIS_KIND
NEEDS_MODEL = {"spectra": "singular values, which analyze's JSON does not keep"}


class SavedError(InputError):
    """A file named as a saved analysis that is not one (unreadable, too large, not JSON, a field out of place)."""


def is_saved(spec: object) -> bool:
    """Whether a model argument names a saved analysis: an existing file whose name ends in .json."""
    if spec is None or not isinstance(spec, (str, Path)):
        return False
    p = Path(spec)
    return p.suffix.lower() == ".json" and p.is_file()


def read_saved(path: str | Path) -> AnalysisResult:
    """The AnalysisResult a `qkinspect analyze -o FILE.json` document holds (spectra empty: the JSON keeps none).

    Raises:
        SavedError: the file cannot be read, is larger than MAX_BYTES, is not the JSON of `analyze`, or a field
            has the wrong type or lies outside the model's shapes.
    """
    path = Path(path)
    doc = _load(path)
    try:
        return _result(doc)
    except _Bad as e:
        raise SavedError(f"{path}: not a saved analysis of `qkinspect analyze -o FILE.json`: {e}") from None


class _Bad(Exception):
    pass


def _load(path: Path) -> dict[str, Any]:
    """The document, read as every saved document is (qkinspect.reading: a regular file, at most MAX_BYTES,
    nested at most MAX_DEPTH levels), then its head checked."""
    doc = read_json(path, what="a saved analysis", limit=MAX_BYTES, max_depth=MAX_DEPTH, error=SavedError)
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("kind") != KIND:
        raise SavedError(f"{path}: not a saved analysis (the JSON of `qkinspect analyze -o FILE.json` has "
                         f"\"schema\": \"{SCHEMA}\" and \"kind\": \"{KIND}\")")
    return doc


def _get(d: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, optional: bool = False) -> Any:
    if key not in d or d[key] is None:
        if optional:
            return None
        raise _Bad(f"{where}.{key} is missing")
    v = d[key]
    if isinstance(v, bool) and kind in (int, float, (int, float)):
        raise _Bad(f"{where}.{key} is not a number")
    if not isinstance(v, kind):
        raise _Bad(f"{where}.{key} is not {_name(kind)}")
    return v


def _name(kind) -> str:
    names = {int: "an integer", str: "a string", dict: "an object", list: "an array", bool: "true or false",
             float: "a number"}
    return names.get(kind, "a number") if not isinstance(kind, tuple) else "a number"


def _count(d: Mapping[str, Any], key: str, where: str, lo: int = 0, hi: int = 1 << 20,
           optional: bool = False) -> int | None:
    v = _get(d, key, int, where, optional)
    if v is not None and not lo <= v < hi:
        raise _Bad(f"{where}.{key} = {v} is outside {lo}..{hi - 1}")
    return v


def _number(v: Any, where: str) -> float:
    """A metric's value: a finite number, or null (NaN, as analyze wrote an undefined value)."""
    if v is None:
        return math.nan
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _Bad(f"{where} is not a number")
    if abs(v) > MAX_METRIC:
        raise _Bad(f"{where} is {v:.3g}, beyond any metric's value (at most {MAX_METRIC:.0e} in size)")
    return float(v)


def _result(doc: dict[str, Any]) -> AnalysisResult:
    info = _model(_get(doc, "model", dict, "model"))
    blocks = {b.key: b for b in info.blocks}
    processing = _processing(_get(doc, "processing", dict, "processing"))
    heads = [_head(h, f"heads[{i}]", blocks) for i, h in enumerate(_items(doc, "heads"))]
    layers = [_layer(r, f"layers[{i}]", blocks) for i, r in enumerate(_items(doc, "layers"))]
    baselines = [_baseline(b, f"baselines[{i}]", blocks) for i, b in enumerate(_items(doc, "baselines"))]
    warnings = [w for w in _get(doc, "warnings", list, "", optional=True) or [] if isinstance(w, str)]
    names = list(processing.metrics or ())
    return AnalysisResult(info, processing, heads, layers, baselines, {}, warnings, names)


def _items(doc: dict[str, Any], key: str) -> list[dict[str, Any]]:
    items = _get(doc, key, list, "", optional=key == "baselines") or []
    for i, x in enumerate(items):
        if not isinstance(x, dict):
            raise _Bad(f"{key}[{i}] is not an object")
    return items


def _model(m: dict[str, Any]):
    for key in ("name", "source", "model_type", "format"):
        _get(m, key, str, "model")
    blocks = _get(m, "blocks", list, "model")
    if not blocks:
        raise _Bad("model.blocks is empty")
    for i, b in enumerate(blocks):
        where = f"model.blocks[{i}]"
        if not isinstance(b, dict):
            raise _Bad(f"{where} is not an object")
        _get(b, "name", str, where)
        _get(b, "label", str, where, optional=True)
        for key in ("n_layers", "n_heads", "n_kv_heads", "d_model", "d_head"):
            _count(b, key, where, lo=1)
        for key in ("rotary_dims", "d_model_kv", "d_head_v"):
            _count(b, key, where, lo=1, optional=True)
        if b["n_layers"] * b["n_heads"] > MAX_GRID:
            raise _Bad(f"{where}: {b['n_layers']} layers × {b['n_heads']} heads is more than {MAX_GRID:,}")
        if b["n_heads"] % b["n_kv_heads"]:
            raise _Bad(f"{where}.n_kv_heads = {b['n_kv_heads']} does not divide n_heads = {b['n_heads']}")
    try:
        info = model_info(m)
    except (TypeError, ValueError, KeyError) as e:
        raise _Bad(f"model: {e}") from None
    if len({b.key for b in info.blocks}) != len(info.blocks):
        raise _Bad("model.blocks name one block twice")
    return info


def _processing(p: dict[str, Any]) -> Processing:
    known = Processing.__dataclass_fields__
    kw: dict[str, Any] = {}
    for key, value in p.items():
        if key not in known:
            continue  # a field a newer qkinspect records: nothing here reads it
        if key in ("blocks", "layers", "heads", "metrics", "qk_norm_not_folded"):
            if value is not None and not (isinstance(value, list) and all(isinstance(x, (str, int)) for x in value)):
                raise _Bad(f"processing.{key} is not an array of names or indexes")
            kw[key] = None if value is None else tuple(value)
            if key == "qk_norm_not_folded":
                kw[key] = kw[key] or ()  # a list of block names; null reads as none
        else:
            kw[key] = value
    for key in ("fold_ln", "fold_qk_norm", "layer_form"):
        if not isinstance(kw.get(key, False), bool):
            raise _Bad(f"processing.{key} is not true or false")
    for key in ("precision", "device", "products"):
        if key in kw and not isinstance(kw[key], str):
            raise _Bad(f"processing.{key} is not a string")
    count = kw.get("recomputed_float64", 0)
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= 2**40:
        raise _Bad("processing.recomputed_float64 is not a count of heads")
    return Processing(**kw)


def _block_of(d: dict[str, Any], where: str, blocks: dict[str, Any]):
    name = _get(d, "block", str, where)
    if name not in blocks:
        raise _Bad(f"{where}.block {name!r} is not one of the model's blocks ({', '.join(blocks)})")
    return blocks[name]


def _head(h: dict[str, Any], where: str, blocks: dict[str, Any]) -> HeadRecord:
    b = _block_of(h, where, blocks)
    layer = _count(h, "layer", where, hi=b.n_layers)
    head = _count(h, "head", where, hi=b.n_heads)
    kv = _count(h, "kv_head", where, hi=b.n_kv_heads)
    ranks = {k: _count(h, k, where, hi=1 << 20, optional=True) for k in ("rank_q", "rank_k", "rank_v")}
    skip = {"block", "layer", "head", "kv_head", *ranks}
    values = {k: _number(v, f"{where}.{k}") for k, v in h.items() if k not in skip}
    return HeadRecord(b.key, layer, head, kv, values, **ranks)


def _layer(r: dict[str, Any], where: str, blocks: dict[str, Any]) -> LayerRecord:
    import numpy as np

    b = _block_of(r, where, blocks)
    layer = _count(r, "layer", where, hi=b.n_layers)
    n_heads = _count(r, "n_heads", where, lo=1, hi=b.n_heads + 1)
    overlap = None
    if r.get("head_overlap") is not None:
        m = r["head_overlap"]
        if not isinstance(m, list) or len(m) != b.n_heads or any(not isinstance(row, list) or len(row) != b.n_heads
                                                                  for row in m):
            raise _Bad(f"{where}.head_overlap is not a {b.n_heads} × {b.n_heads} array")
        overlap = np.array([[_number(v, f"{where}.head_overlap") for v in row] for row in m])  # (H, H)
    values = {k: _number(v, f"{where}.{k}") for k, v in r.items()
              if k not in ("block", "layer", "n_heads", "head_overlap")}
    return LayerRecord(b.key, layer, n_heads, values, overlap)


def _baseline(d: dict[str, Any], where: str, blocks: dict[str, Any]) -> Baseline:
    b = _block_of(d, where, blocks)
    metric = _get(d, "metric", str, where)
    return Baseline(b.key, metric, _number(d.get("mean"), f"{where}.mean"), _number(d.get("std"), f"{where}.std"),
                    _count(d, "n", where, lo=0))


def needs_model(kind: str, path: object) -> None:
    """InputError when the figure `kind` cannot be drawn from a saved analysis (the spectra)."""
    if kind in NEEDS_MODEL:
        raise InputError(f"{path}: the {kind} figure needs {NEEDS_MODEL[kind]}; draw it from the model "
                         f"(qkinspect plot MODEL --kind {kind})")

# The two verbs every capability's saved module offers (qkinspect.capabilities): read one back, and whether a
# model argument is one of its own. The names above stay, as they were published.
read = read_saved
