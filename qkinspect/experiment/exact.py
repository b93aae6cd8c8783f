"""The exact per-unit runner: edit one unit (a head, a layer's chosen heads, or every chosen layer's), write it into
the model, score the text from the first edited layer on (the states entering it come from one unedited pass),
restore the model exactly, and record the run. `run_experiment` runs every unit this way; the estimate verifies its
chosen heads this way.
"""

from __future__ import annotations

import time

from qkinspect.experiment.edits.apply import apply_edit
from qkinspect.experiment.edits.names import Edit
from qkinspect.experiment.model.scoring import Scorer
from qkinspect.experiment.model.writeback import written
from qkinspect.experiment.results import Run
from qkinspect.layer import AttentionLayer

Unit = list[tuple[int, list[int]]]  # (layer, heads) pairs edited together in one run


def make_units(scope: str, layers: list[int], heads: list[int]) -> list[Unit]:
    if scope == "head":
        return [[(i, [h])] for i in layers for h in heads]
    if scope == "layer":
        return [[(i, heads)] for i in layers]
    return [[(i, heads) for i in layers]]


def first_layer(unit: Unit) -> int:
    """The first layer a unit edits: the run starts there."""
    return min(i for i, _ in unit)


def run_unit(scorer: Scorer, hf, originals: dict[int, AttentionLayer], unit: Unit, edit: Edit, scope: str,
             base: float, rotary: str, start: int | None = None) -> Run:
    """Edit `unit`, run the model from its first edited layer (or from `start`: 0 runs everything, as a naive
    loop would), restore it, and record the run."""
    t0 = time.perf_counter()
    results = [apply_edit(originals[i], edit, hs, rotary=rotary) for i, hs in unit]  # type: ignore[arg-type]
    with written(hf, [r.layer for r in results]):
        t1 = time.perf_counter()
        loss = scorer.score(start=first_layer(unit) if start is None else start)
        t_forward = time.perf_counter() - t1
    figures = [v for r in results for v in r.predicted.values()]
    return Run(
        edit=str(edit), scope=scope, layer=unit[0][0] if scope != "model" else None,
        head=unit[0][1][0] if scope == "head" else None,
        heads=len(figures), loss=loss, dloss=loss - base, ratio=None,
        predicted=sum(figures) / len(figures) if figures else None,
        offset0=any(r.offset0_only for r in results), seconds=time.perf_counter() - t0,
        forward_seconds=t_forward, dloss_se=scorer.paired_se())
