"""What every JSON document qkinspect writes shares, for every capability: its head (`envelope`: schema, kind, tool
version), the model as a dict and back (`model_dict`, `model_info`), and the JSON-safe copy every document goes
through (`json_safe`). A ground module: the records of each capability, the sweep's store and the CLI's output use
it alike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from qkinspect.layer import ModelInfo

SCHEMA = "qkinspect/1"


def envelope(kind: str, **fields: Any) -> dict[str, Any]:
    """The head of every JSON document qkinspect writes: schema, command kind, tool version, then `fields`."""
    from qkinspect.version import __version__

    return {"schema": SCHEMA, "kind": kind, "tool": {"name": "qkinspect", "version": __version__}, **fields}


def model_dict(info: ModelInfo) -> dict[str, Any]:
    d = asdict(info)
    d["blocks"] = [{**asdict(b), "flags": b.flags()} for b in info.blocks]
    return d


def model_info(d: Mapping[str, Any]) -> ModelInfo:
    """The ModelInfo a `model_dict` was made from (flags are derived, so they are dropped)."""
    from qkinspect.layer import BlockSpec

    known = BlockSpec.__dataclass_fields__
    blocks = tuple(BlockSpec(**{k: v for k, v in b.items() if k in known}) for b in d["blocks"])
    return ModelInfo(**{k: v for k, v in d.items() if k in ModelInfo.__dataclass_fields__ and k != "blocks"},
                     blocks=blocks)


def json_safe(x: Any) -> Any:
    """A JSON-safe copy: NaN/inf -> null, numpy and torch values -> Python (through their `tolist`), tuples ->
    lists, complex -> [re, im], Path -> str, Enum -> its value, dataclasses -> dicts. What every document
    qkinspect writes goes through (the CLI's output too), so `json.dump(..., allow_nan=False)` never fails."""
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if is_dataclass(x) and not isinstance(x, type):
        return json_safe(asdict(x))
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if hasattr(x, "tolist") and not isinstance(x, (str, bytes)):  # numpy arrays and scalars, torch tensors
        return json_safe(x.tolist())
    if isinstance(x, bool) or x is None or isinstance(x, (int, str)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, complex):
        return [json_safe(x.real), json_safe(x.imag)]
    if isinstance(x, Enum):
        return x.value
    if isinstance(x, Path):
        return str(x)
    return x
