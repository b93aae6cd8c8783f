"""Checking a JSON document qkinspect reads back (an experiment's runs.json, a sweep's manifest and results) where
it enters: each value's type and range, with one line naming the file and the key when it is wrong
(`runs.json: runs[3].dloss is "abc", not a number`). The documents' own rules live beside their readers
(experiment/saved.py, sweep/verify.py); this is the vocabulary they share.
"""

from __future__ import annotations

import math
from typing import Any

from qkinspect.errors import InputError

MAX_VALUE = 1e9  # a loss (nats), a Δloss, a ratio, a prediction or a metric larger than this is not one
MAX_INDEX = 1 << 20  # a layer or head number, a count (as checkpoint configs are bounded)


def type_name(x: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number",
             type(None): "null", dict: "an object"}
    return names.get(type(x), type(x).__name__)


def show(x: Any, limit: int = 40) -> str:
    """A value as a message shows it: a string in double quotes, a container by its type, cut to `limit`."""
    if isinstance(x, (dict, list)):
        return type_name(x)
    text = repr(x) if not isinstance(x, str) else f'"{x}"'
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Checker:
    """Type and range checks of one document's values, each raising InputError naming `path` and the key."""

    def __init__(self, path: object, error: type[InputError] = InputError):
        self.path = path
        self.error = error

    def fail(self, key: str, problem: str) -> InputError:
        return self.error(f"{self.path}: {key} {problem}")

    def obj(self, x: Any, key: str) -> dict:
        if not isinstance(x, dict):
            raise self.fail(key, f"is {type_name(x)}, not an object")
        return x

    def text(self, x: Any, key: str, *, null: bool = False) -> str | None:
        if x is None and null:
            return None
        if not isinstance(x, str):
            raise self.fail(key, f"is {show(x)}, not a string")
        return x

    def number(self, x: Any, key: str, *, null: bool = True, low: float = -MAX_VALUE,
               high: float = MAX_VALUE) -> float | None:
        if x is None and null:
            return None
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise self.fail(key, f"is {show(x)}, not a number")
        if not math.isfinite(x) or not low <= x <= high:
            raise self.fail(key, f"is {show(x)}, outside {low:g} .. {high:g}")
        return x

    def index(self, x: Any, key: str, *, null: bool, below: int = MAX_INDEX, what: str = "") -> int | None:
        if x is None and null:
            return None
        if isinstance(x, bool) or not isinstance(x, int):
            raise self.fail(key, f"is {show(x)}, not a whole number")
        if not 0 <= x < below:
            raise self.fail(key, f"is {x}, outside 0 .. {below - 1}{what}")
        return x


BLOCK_COUNTS = ("n_layers", "n_heads", "n_kv_heads", "d_model", "d_head")
MODEL_TEXTS = ("name", "source", "revision", "model_type", "format", "architecture", "dtype", "quantization")


def model_blocks(c: Checker, model: Any, key: str, *, required: bool = True) -> dict[str, tuple[int, int]]:
    """Check a recorded model (schema qkinspect/1's `model`: a `model_dict`) and return its blocks' layers and
    heads by block key (label, else name); empty when `required` is False and it records no blocks."""
    m = c.obj(model, key)
    for name in MODEL_TEXTS:
        if name in m or (required and name in ("name", "source", "model_type", "format")):
            c.text(m.get(name), f"{key}.{name}", null=name not in ("name", "source", "model_type", "format"))
    blocks = m.get("blocks")
    if blocks is None and not required:
        return {}
    if not isinstance(blocks, list) or not blocks:
        raise c.fail(f"{key}.blocks", f"is {type_name(blocks)}, not a list of blocks")
    if len(blocks) > 64:
        raise c.fail(f"{key}.blocks", f"has {len(blocks)} blocks; no model has more than 64")
    out: dict[str, tuple[int, int]] = {}
    for i, b in enumerate(blocks):
        where = f"{key}.blocks[{i}]"
        b = c.obj(b, where)
        name = c.text(b.get("name"), f"{where}.name")
        label = c.text(b.get("label"), f"{where}.label", null=True)
        counts = {}
        for n in BLOCK_COUNTS:
            value = c.index(b.get(n), f"{where}.{n}", null=n not in ("n_layers", "n_heads"), below=MAX_INDEX + 1)
            if value is not None and value < 1:
                raise c.fail(f"{where}.{n}", "is 0; it must be at least 1")
            counts[n] = value
        out[label or name] = (counts["n_layers"], counts["n_heads"])
    return out
