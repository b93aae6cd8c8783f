"""A saved experiment read back: the JSON `qkinspect experiment -o runs.json` writes
(qkinspect.experiment.results), where it enters `plot` and `report`: checked once, whole, so that nothing downstream
meets a value it cannot use (docs/security.md).

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

from pathlib import Path
from typing import Any

from qkinspect.checking import MAX_INDEX, MAX_VALUE, Checker, model_blocks, show
from qkinspect.errors import InputError
from qkinspect.experiment.requests import SCOPES

MAX_RUNS = 1 << 20  # runs in one document
MAX_CELLS = 1 << 20  # layers × heads of one edit's heatmap (a 7B model has 1 024; the largest ones ~16 000)

NUMBERS = ("loss", "dloss", "dloss_ratio_ablate", "predicted", "seconds")


def read_experiment(path: Path) -> dict[str, Any]:
    """The document `qkinspect experiment -o FILE.json` wrote, checked whole (`check_experiment`); InputError (one
    line naming the file and the key) for anything else."""
    from qkinspect.reading import read_json

    return check_experiment(read_json(path, what="an experiment document"), path)


def check_experiment(doc: Any, path: object) -> dict[str, Any]:
    """`doc` if it is a usable experiment document; InputError naming `path` and the key otherwise."""
    c = Checker(path)
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


def _model(c: Checker, model: Any) -> tuple[int, int]:
    """The most layers and heads the document's model declares (MAX_INDEX when it declares none)."""
    blocks = model_blocks(c, model, "model", required=False)
    if not blocks:
        return MAX_INDEX, MAX_INDEX
    return max(n for n, _ in blocks.values()), max(h for _, h in blocks.values())


def _run(c: Checker, run: Any, key: str, layers: int, heads: int) -> None:
    from qkinspect.experiment.edits.names import parse_edit

    run = c.obj(run, key)
    edit = c.text(run.get("edit"), f"{key}.edit")
    try:
        canonical = str(parse_edit(edit))
    except (InputError, ValueError) as e:
        raise c.fail(f"{key}.edit", f"is {show(edit)}: {e}") from None
    if canonical != edit:
        raise c.fail(f"{key}.edit", f"is {show(edit)}, not written as qkinspect writes it ({canonical})")
    scope = run.get("scope")
    if scope not in SCOPES:
        raise c.fail(f"{key}.scope", f"is {show(scope)}, not one of {', '.join(SCOPES)}")
    c.index(run.get("layer"), f"{key}.layer", null=scope == "model", below=layers,
            what=" (the model's layers)" if layers < MAX_INDEX else "")
    c.index(run.get("head"), f"{key}.head", null=scope != "head", below=heads,
            what=" (the model's heads)" if heads < MAX_INDEX else "")
    c.index(run.get("heads"), f"{key}.heads", null=True, below=MAX_INDEX * MAX_INDEX)
    for name in NUMBERS:
        c.number(run.get(name), f"{key}.{name}", low=0 if name == "seconds" else -MAX_VALUE)
    c.text(run.get("predictor"), f"{key}.predictor", null=True)
    if not isinstance(run.get("offset0_only", False), bool):
        raise c.fail(f"{key}.offset0_only", f"is {show(run['offset0_only'])}, not true or false")
