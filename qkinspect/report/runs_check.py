"""Where an experiment's JSON (runs.json, from `qkinspect experiment -o`) enters `plot` and `report`: checked once,
whole, so that nothing downstream meets a value it cannot use (docs/security.md).

A runs.json is input like any other: it may be hand-edited, truncated, or written to make the tool misbehave. The
check refuses, with one line naming the file and the key (`runs.json: runs[3].dloss is "abc", not a number`):

- a document that is not an object with `"kind": "experiment"`, a `runs` list and a finite `baseline`;
- a run that is not an object, an `edit` the edit parser refuses (or not in its own spelling), a `scope` other than
  head/layer/model, a `layer`/`head` that is not a whole number from 0 (required for the scopes that need them), or
  past the layers and heads the document's own model declares;
- a loss, Δloss, ratio or prediction that is not a finite number of at most 1e9 in size (or null);
- `model`, `measure` and `predictors` fields of the wrong type;
- more than MAX_RUNS runs, or a layer × head grid (per edit) of more than MAX_CELLS cells: the figure allocates it.

Fields it does not know are kept and ignored (newer versions may add some).
"""

from __future__ import annotations

import math
from typing import Any

from qkinspect.errors import InputError

MAX_RUNS = 1 << 20  # runs in one document
MAX_CELLS = 1 << 20  # layers × heads of one edit's heatmap (a 7B model has 1 024; the largest ones ~16 000)
MAX_INDEX = 1 << 20  # a layer or head number (as checkpoint configs are bounded)
MAX_VALUE = 1e9  # a loss (nats), a Δloss, a ratio or a prediction larger than this is not one
SCOPES = ("head", "layer", "model")
NUMBERS = ("loss", "dloss", "dloss_ratio_ablate", "predicted", "seconds")
BLOCK_COUNTS = ("n_layers", "n_heads", "n_kv_heads", "d_model", "d_head")


def _type(x: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number",
             type(None): "null", dict: "an object"}
    return names.get(type(x), type(x).__name__)


def _show(x: Any) -> str:
    if isinstance(x, (dict, list)):
        return _type(x)
    text = repr(x) if not isinstance(x, str) else f'"{x}"'
    return text if len(text) <= 40 else text[:37] + "..."


class _Checker:
    def __init__(self, path: object):
        self.path = path

    def fail(self, key: str, problem: str) -> InputError:
        return InputError(f"{self.path}: {key} {problem}")

    def obj(self, x: Any, key: str) -> dict:
        if not isinstance(x, dict):
            raise self.fail(key, f"is {_type(x)}, not an object")
        return x

    def text(self, x: Any, key: str, *, null: bool = False) -> str | None:
        if x is None and null:
            return None
        if not isinstance(x, str):
            raise self.fail(key, f"is {_show(x)}, not a string")
        return x

    def number(self, x: Any, key: str, *, null: bool = True, low: float = -MAX_VALUE) -> float | None:
        if x is None and null:
            return None
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise self.fail(key, f"is {_show(x)}, not a number")
        if not math.isfinite(x) or not low <= x <= MAX_VALUE:
            raise self.fail(key, f"is {_show(x)}, outside {low:g} .. {MAX_VALUE:g}")
        return x

    def index(self, x: Any, key: str, *, null: bool, below: int = MAX_INDEX, what: str = "") -> int | None:
        if x is None and null:
            return None
        if isinstance(x, bool) or not isinstance(x, int):
            raise self.fail(key, f"is {_show(x)}, not a whole number")
        if not 0 <= x < below:
            raise self.fail(key, f"is {x}, outside 0 .. {below - 1}{what}")
        return x


def check_experiment(doc: Any, path: object) -> dict[str, Any]:
    """`doc` if it is a usable experiment document; InputError naming `path` and the key otherwise."""
    c = _Checker(path)
    if not isinstance(doc, dict) or doc.get("kind") != "experiment" or not isinstance(doc.get("runs"), list):
        raise InputError(f"{path}: not the JSON of `qkinspect experiment` (no \"kind\": \"experiment\" with runs)")
    c.number(doc.get("baseline"), "baseline", null=False)
    layers, heads = _model(c, doc.get("model", {}))
    measure = c.obj(doc.get("measure", {}), "measure")
    for key in ("name", "text", "kind"):
        if key in measure:
            c.text(measure[key], f"measure.{key}", null=key != "name")
    for key in ("tokens", "scored", "windows", "window"):
        if key in measure:
            c.index(measure[key], f"measure.{key}", null=True, below=1 << 62)
    for edit, what in c.obj(doc.get("predictors", {}) or {}, "predictors").items():
        c.text(what, f"predictors.{edit}", null=True)
    runs = doc["runs"]
    if len(runs) > MAX_RUNS:
        raise c.fail("runs", f"has {len(runs)} runs, more than {MAX_RUNS}")
    grids: dict[str, tuple[set, set]] = {}
    for i, run in enumerate(runs):
        _run(c, run, f"runs[{i}]", layers, heads)
        if run["scope"] == "head":
            ls, hs = grids.setdefault(run["edit"], (set(), set()))
            ls.add(run["layer"])
            hs.add(run["head"])
    for edit, (ls, hs) in grids.items():
        if len(ls) * len(hs) > MAX_CELLS:
            raise c.fail("runs", f"span {len(ls)} layers × {len(hs)} heads for {edit}, more than the {MAX_CELLS} "
                                 "cells a heatmap may have")
    return doc


def _model(c: _Checker, model: Any) -> tuple[int, int]:
    """The most layers and heads the document's model declares (MAX_INDEX when it declares none)."""
    m = c.obj(model, "model")
    for key in ("name", "source", "revision", "model_type", "format", "architecture", "dtype"):
        if key in m:
            c.text(m[key], f"model.{key}", null=True)
    blocks = m.get("blocks")
    if blocks is None:
        return MAX_INDEX, MAX_INDEX
    if not isinstance(blocks, list) or not blocks:
        raise c.fail("model.blocks", f"is {_type(blocks)}, not a list of blocks")
    most = {"n_layers": 0, "n_heads": 0}
    for i, b in enumerate(blocks):
        b = c.obj(b, f"model.blocks[{i}]")
        c.text(b.get("name"), f"model.blocks[{i}].name")
        for key in BLOCK_COUNTS:
            if key in b or key in most:
                n = c.index(b.get(key), f"model.blocks[{i}].{key}", null=key not in most, below=MAX_INDEX + 1)
                if key in most:
                    if n < 1:
                        raise c.fail(f"model.blocks[{i}].{key}", "is 0; it must be at least 1")
                    most[key] = max(most[key], n)
    return most["n_layers"], most["n_heads"]


def _run(c: _Checker, run: Any, key: str, layers: int, heads: int) -> None:
    from qkinspect.experiment.edit_names import parse_edit

    run = c.obj(run, key)
    edit = c.text(run.get("edit"), f"{key}.edit")
    try:
        canonical = str(parse_edit(edit))
    except (InputError, ValueError) as e:
        raise c.fail(f"{key}.edit", f"is {_show(edit)}: {e}") from None
    if canonical != edit:
        raise c.fail(f"{key}.edit", f"is {_show(edit)}, not written as qkinspect writes it ({canonical})")
    scope = run.get("scope")
    if scope not in SCOPES:
        raise c.fail(f"{key}.scope", f"is {_show(scope)}, not one of {', '.join(SCOPES)}")
    c.index(run.get("layer"), f"{key}.layer", null=scope == "model", below=layers,
            what=" (the model's layers)" if layers < MAX_INDEX else "")
    c.index(run.get("head"), f"{key}.head", null=scope != "head", below=heads,
            what=" (the model's heads)" if heads < MAX_INDEX else "")
    c.index(run.get("heads"), f"{key}.heads", null=True, below=MAX_INDEX * MAX_INDEX)
    for name in NUMBERS:
        c.number(run.get(name), f"{key}.{name}", low=0 if name == "seconds" else -MAX_VALUE)
    c.text(run.get("predictor"), f"{key}.predictor", null=True)
    if not isinstance(run.get("offset0_only", False), bool):
        raise c.fail(f"{key}.offset0_only", f"is {_show(run['offset0_only'])}, not true or false")
