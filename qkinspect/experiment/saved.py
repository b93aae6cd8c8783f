"""A saved experiment read back: the JSON `qkinspect experiment -o runs.json` writes (qkinspect.experiment.results),
where it enters `plot` and `report`: checked once, whole, and returned as the records the writer wrote it from
(`ExperimentResult`, its `Run`s, `Estimate`, `Healing`), so that nothing downstream meets a value it cannot use
(docs/security.md).

A runs.json is input like any other: it may be hand-edited, truncated, or written to make the tool misbehave. The
check refuses, with one line naming the file and the key (`runs.json: runs[3].dloss is "abc", not a number`):

- a document that is not an object with `"kind": "experiment"`, a `runs` list and a finite `baseline`;
- a run that is not an object, an `edit` the edit parser refuses (or not in its own spelling), a `scope` other than
  head/layer/model, a `layer`/`head` that is not a whole number from 0 (required for the scopes that need them), or
  past the layers and heads the document's own model declares;
- a loss, Δloss, ratio, standard error, estimate or prediction that is not a finite number of at most 1e9 in size
  (or null), an `unreliable` or `offset0_only` that is not true or false;
- `model`, `measure`, `timing`, `predictors`, `estimate` and `healing` fields of the wrong type (healing's fields
  as the first qkinspect that healed wrote them; those added since may be absent);
- more than MAX_RUNS runs, or a layer × head grid (per edit) of more than MAX_CELLS cells: the figure allocates it.

What the writer always records but a document leaves out (one written by hand, or by an older qkinspect) reads as
None; fields it does not know are ignored (newer versions may add some).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from qkinspect.checking import BLOCK_COUNTS, MAX_INDEX, MAX_VALUE, Checker, model_blocks, show, type_name
from qkinspect.documents import model_info
from qkinspect.errors import InputError
from qkinspect.experiment.requests import SCOPES
from qkinspect.experiment.results import (
    MEASURES,
    Agreement,
    Estimate,
    ExperimentResult,
    HealChange,
    HealedRun,
    Healing,
    HealPoint,
    Precision,
    Run,
)
from qkinspect.layer import ModelInfo
from qkinspect.reading import declares_kind

MAX_RUNS = 1 << 20  # runs in one document (and healed runs, steps of a training-loss curve, points of a curve)
MAX_CELLS = 1 << 20  # layers × heads of one edit's heatmap (a 7B model has 1 024; the largest ones ~16 000)
MAX_COUNT = 1 << 62  # tokens, parameters, steps

NUMBERS = ("loss", "dloss", "dloss_ratio_ablate", "predicted", "dloss_estimate", "spot")
ERRORS = ("seconds", "dloss_se", "dloss_estimate_se", "spot_se")  # numbers from 0
# The model's identity and its blocks' shapes: an experiment goes into the report of the model it was run on only.
IDENTITY = ("source", "revision", "model_type", "format", "architecture")
BLOCK_SHAPE = ("name", "n_layers", "n_heads", "n_kv_heads", "d_model", "d_head")


def read_experiment(path: Path) -> ExperimentResult:
    """The document `qkinspect experiment -o FILE.json` wrote, checked whole and read into its records
    (`check_experiment`); InputError (one line naming the file and the key) for anything else.

    Example:
        >>> result = read_experiment(Path("runs.json"))  # doctest: +SKIP
        >>> experiment_figure(result).savefig("runs.png")  # qkinspect.report.experiment.figure  # doctest: +SKIP
    """
    from qkinspect.reading import read_json

    return check_experiment(read_json(path, what="an experiment document"), path)


def check_experiment(doc: Any, path: object) -> ExperimentResult:
    """The records of `doc` if it is a usable experiment document; InputError naming `path` and the key
    otherwise."""
    c = Checker(path)
    if not isinstance(doc, dict) or doc.get("kind") != "experiment" or not isinstance(doc.get("runs"), list):
        raise InputError(f"{path}: not the JSON of `qkinspect experiment` (no \"kind\": \"experiment\" with runs)")
    baseline = c.number(doc.get("baseline"), "baseline", null=False)
    model, layers, heads = _model(c, doc.get("model", {}))
    measure = _measure(c, doc.get("measure", {}))
    predictors = {edit: c.text(what, f"predictors.{edit}", null=True)
                  for edit, what in c.obj(doc.get("predictors", {}) or {}, "predictors").items()}
    if len(doc["runs"]) > MAX_RUNS:
        raise c.fail("runs", f"has {len(doc['runs'])} runs, more than {MAX_RUNS}")
    runs = tuple(_run(c, run, f"runs[{i}]", layers, heads) for i, run in enumerate(doc["runs"]))
    _check_grids(c, runs)
    timing = c.obj(doc.get("timing", {}), "timing")
    return ExperimentResult(
        model=model, measure=measure["kind"], text=measure.get("text"), tokens=measure.get("tokens"),
        scored=measure.get("scored"), windows=measure.get("windows"), window=measure.get("window"),
        baseline=baseline, runs=runs, rotary=measure.get("rotary"),  # type: ignore[arg-type]
        baseline_seconds=c.number(timing.get("baseline_seconds"), "timing.baseline_seconds", low=0),
        seconds=c.number(timing.get("runs_seconds"), "timing.runs_seconds", low=0), predictors=predictors,
        healing=_healing(c, doc.get("healing"), layers, heads), estimate=_estimate(c, doc.get("estimate")))


def check_same_model(saved: ExperimentResult, model: ModelInfo, path: object) -> None:
    """InputError (one line) unless the experiment `saved` (read from `path`) was run on `model`: the same
    identity (source, revision, type, format, architecture) and the same attention blocks."""
    for key in IDENTITY:
        if getattr(saved.model, key) != getattr(model, key):
            raise InputError(f"{path}: the experiment was run on {saved.model.name!r} ({key} "
                             f"{getattr(saved.model, key)!r}), not on this model ({key} {getattr(model, key)!r})")
    if _shapes(saved.model) != _shapes(model):
        raise InputError(f"{path}: the experiment's model has other attention blocks than this model")


def _shapes(model: ModelInfo) -> list[list[Any]]:
    return [[getattr(b, k) for k in BLOCK_SHAPE] for b in model.blocks]


def _model(c: Checker, model: Any) -> tuple[ModelInfo, int, int]:
    """The document's model, and the most layers and heads it declares (MAX_INDEX when it declares none). What a
    hand-written model leaves out reads as None."""
    blocks = model_blocks(c, model, "model", required=False)
    layers, heads = ((max(n for n, _ in blocks.values()), max(h for _, h in blocks.values())) if blocks
                     else (MAX_INDEX, MAX_INDEX))
    filled = [{**dict.fromkeys(BLOCK_COUNTS), **b} for b in model.get("blocks") or []]
    info = model_info({**dict.fromkeys(("name", "source", "model_type", "format")), **model, "blocks": filled})
    return info, layers, heads


def _measure(c: Checker, measure: Any) -> dict[str, Any]:
    """The checked `measure` object; its `kind` from its name where only the name is given."""
    measure = c.obj(measure, "measure")
    for key in ("name", "text", "kind", "rotary"):
        if key in measure:
            c.text(measure[key], f"measure.{key}", null=key != "name")
    for key in ("tokens", "scored", "windows", "window"):
        if key in measure:
            c.index(measure[key], f"measure.{key}", null=True, below=1 << 62)
    kind = measure.get("kind") or {name: kind for kind, name in MEASURES.items()}.get(measure.get("name"))
    return {**measure, "kind": kind}


def _edit(c: Checker, edit: Any, key: str) -> str:
    """An edit as qkinspect writes it (the edit parser's own spelling)."""
    from qkinspect.experiment.edits.names import parse_edit

    edit = c.text(edit, key)
    try:
        canonical = str(parse_edit(edit))
    except (InputError, ValueError) as e:
        raise c.fail(key, f"is {show(edit)}: {e}") from None
    if canonical != edit:
        raise c.fail(key, f"is {show(edit)}, not written as qkinspect writes it ({canonical})")
    return edit  # type: ignore[return-value]


def _unit(c: Checker, run: dict, key: str, layers: int, heads: int) -> tuple[str, int | None, int | None]:
    """A run's scope, layer and head (required for the scopes that need them, within the model's)."""
    scope = run.get("scope")
    if scope not in SCOPES:
        raise c.fail(f"{key}.scope", f"is {show(scope)}, not one of {', '.join(SCOPES)}")
    layer = c.index(run.get("layer"), f"{key}.layer", null=scope == "model", below=layers,
                    what=" (the model's layers)" if layers < MAX_INDEX else "")
    head = c.index(run.get("head"), f"{key}.head", null=scope != "head", below=heads,
                   what=" (the model's heads)" if heads < MAX_INDEX else "")
    return scope, layer, head


def _flag(c: Checker, x: Any, key: str, *, null: bool) -> bool | None:
    if (x is None and null) or isinstance(x, bool):
        return x
    raise c.fail(key, f"is {show(x)}, not true or false")


def _run(c: Checker, run: Any, key: str, layers: int, heads: int) -> Run:
    run = c.obj(run, key)
    edit = _edit(c, run.get("edit"), f"{key}.edit")
    scope, layer, head = _unit(c, run, key, layers, heads)
    n = c.index(run.get("heads"), f"{key}.heads", null=True, below=MAX_INDEX * MAX_INDEX)
    values = {name: c.number(run.get(name), f"{key}.{name}", low=0 if name in ERRORS else -MAX_VALUE)
              for name in (*NUMBERS, *ERRORS)}
    moved = c.number(run.get("moved"), f"{key}.moved", low=0, high=math.inf)  # |Δo| / |o|: large where o ~ 0
    reach = c.number(run.get("reach"), f"{key}.reach", low=0, high=math.inf)
    c.text(run.get("predictor"), f"{key}.predictor", null=True)
    offset0 = _flag(c, run.get("offset0_only", False), f"{key}.offset0_only", null=False)
    return Run(edit=edit, scope=scope, layer=layer, head=head, heads=n, loss=values["loss"], dloss=values["dloss"],
               ratio=values["dloss_ratio_ablate"], predicted=values["predicted"], offset0=bool(offset0),
               seconds=values["seconds"], forward_seconds=None, dloss_se=values["dloss_se"],
               dloss_estimate=values["dloss_estimate"], dloss_estimate_se=values["dloss_estimate_se"], moved=moved,
               unreliable=_flag(c, run.get("unreliable"), f"{key}.unreliable", null=True), reach=reach,
               spot=values["spot"], spot_se=values["spot_se"])


def _check_grids(c: Checker, runs: tuple[Run, ...]) -> None:
    """Refuse an edit whose head-scope runs span more than MAX_CELLS layer × head cells."""
    grids: dict[str, tuple[set, set]] = {}
    for run in runs:
        if run.scope == "head":
            ls, hs = grids.setdefault(run.edit, (set(), set()))
            ls.add(run.layer)
            hs.add(run.head)
    for edit, (ls, hs) in grids.items():
        if len(ls) * len(hs) > MAX_CELLS:
            raise c.fail("runs", f"span {len(ls)} layers × {len(hs)} heads for {edit}, more than the {MAX_CELLS} "
                                 "cells a heatmap may have")


def _estimate(c: Checker, est: Any) -> Estimate | None:
    if est is None:
        return None
    est = c.obj(est, "estimate")
    agreement = []
    for i, a in enumerate(_items(c, est.get("agreement"), "estimate.agreement")):
        key = f"estimate.agreement[{i}]"
        a = c.obj(a, key)
        agreement.append(Agreement(
            edit=c.text(a.get("edit"), f"{key}.edit"),  # type: ignore[arg-type]
            verified=c.index(a.get("verified"), f"{key}.verified", null=True) or 0,
            rho=c.number(a.get("rho"), f"{key}.rho", low=-1, high=1),
            sampled=c.index(a.get("sampled"), f"{key}.sampled", null=True) or 0,
            rho_sampled=c.number(a.get("rho_sampled"), f"{key}.rho_sampled", low=-1, high=1)))
    return Estimate(probes=c.index(est.get("probes"), "estimate.probes", null=True),
                    seconds=c.number(est.get("seconds"), "estimate.seconds", low=0),
                    verify_seconds=c.number(est.get("verify_seconds"), "estimate.verify_seconds", low=0),
                    agreement=tuple(agreement),
                    spot_tokens=c.index(est.get("spot_tokens"), "estimate.spot_tokens", null=True) or 0)


def _items(c: Checker, x: Any, key: str, *, null: bool = True) -> list:
    """A list of at most MAX_RUNS items (null or absent: empty, where `null`)."""
    if x is None and null:
        return []
    if not isinstance(x, list):
        raise c.fail(key, f"is {type_name(x)}, not a list")
    if len(x) > MAX_RUNS:
        raise c.fail(key, f"has {len(x)} items, more than {MAX_RUNS}")
    return x


def _nan(c: Checker, d: dict, name: str, where: str, low: float = -MAX_VALUE) -> float:
    """A number the writer writes as null where it is NaN (a diverged loss): null reads as NaN; absent is
    refused."""
    if name not in d:
        raise c.fail(f"{where}.{name}", "is missing")
    x = c.number(d[name], f"{where}.{name}", low=low)
    return math.nan if x is None else x


def _losses(c: Checker, x: Any, key: str) -> tuple[float, ...]:
    """A training-loss curve: numbers, null read as NaN."""
    out = (c.number(v, f"{key}[{i}]") for i, v in enumerate(_items(c, x, key, null=False)))
    return tuple(math.nan if v is None else v for v in out)


def _curve(c: Checker, x: Any, key: str) -> tuple[HealPoint, ...]:
    points = []
    for i, p in enumerate(_items(c, x, key)):
        where = f"{key}[{i}]"
        p = c.obj(p, where)
        points.append(HealPoint(step=c.index(p.get("step"), f"{where}.step", null=False, below=MAX_COUNT),
                                loss=_nan(c, p, "loss", where), diff=_nan(c, p, "diff", where),
                                se=c.number(p.get("se"), f"{where}.se", low=0)))  # type: ignore[arg-type]
    return tuple(points)


def _late(c: Checker, x: Any, key: str, steps: int) -> HealChange | None:
    """A curve's late change (absent or null: none); its steps within the run's."""
    if x is None:
        return None
    x = c.obj(x, key)
    end = c.index(x.get("end"), f"{key}.end", null=False, below=steps + 1)
    start = c.index(x.get("start"), f"{key}.start", null=False, below=end)
    if start < 1:
        raise c.fail(f"{key}.start", "must be at least 1")
    return HealChange(start=start, end=end, change=_nan(c, x, "change", key),  # type: ignore[arg-type]
                      se=c.number(x.get("se"), f"{key}.se", low=0))


def _healed(c: Checker, r: Any, key: str, layers: int, heads: int, steps: int) -> HealedRun:
    r = c.obj(r, key)
    edit = _edit(c, r.get("edit"), f"{key}.edit")
    scope, layer, head = _unit(c, r, key, layers, heads)
    return HealedRun(
        edit=edit, scope=scope, layer=layer, head=head,
        heads=c.index(r.get("heads"), f"{key}.heads", null=False, below=MAX_INDEX * MAX_INDEX),  # type: ignore
        loss=_nan(c, r, "loss", key), control_loss=_nan(c, r, "control_loss", key), diff=_nan(c, r, "diff", key),
        se=c.number(r.get("se"), f"{key}.se", low=0), unhealed=c.number(r.get("unhealed"), f"{key}.unhealed"),
        recovered=c.number(r.get("recovered"), f"{key}.recovered", low=-math.inf, high=math.inf),
        violation=_nan(c, r, "violation", key, low=0), train_loss=_losses(c, r.get("train_loss"), f"{key}.train_loss"),
        seconds=_nan(c, r, "seconds", key, low=0), curve=_curve(c, r.get("curve"), f"{key}.curve"),
        late=_late(c, r.get("late"), f"{key}.late", steps))


def _precision(c: Checker, p: Any) -> Precision | None:
    if p is None:
        return None
    p = c.obj(p, "healing.precision")
    return Precision(dtype=c.text(p.get("dtype"), "healing.precision.dtype"),  # type: ignore[arg-type]
                     reason=c.text(p.get("reason"), "healing.precision.reason"),  # type: ignore[arg-type]
                     **{k: c.number(p.get(k), f"healing.precision.{k}")
                        for k in ("float32_loss", "bfloat16_loss", "threshold")})


def _healing(c: Checker, h: Any, layers: int, heads: int) -> Healing | None:
    """The `healing` section: its fields as the first qkinspect that healed wrote them are required; those added
    since (curves, precision, device, step time) may be absent."""
    if h is None:
        return None
    h = c.obj(h, "healing")
    texts = {k: c.text(h.get(k), f"healing.{k}") for k in ("train", "trained", "text")}
    counts = {k: c.index(h.get(k), f"healing.{k}", null=False, below=MAX_COUNT)
              for k in ("steps", "trained_parameters", "parameters", "train_tokens", "batch_windows")}
    numbers = {k: _nan(c, h, k, "healing", low=0 if k in ("lr", "epochs", "seconds") else -MAX_VALUE)
               for k in ("lr", "epochs", "control_loss", "control_gain", "seconds")}
    tracks = {run: c.text(folder, f"healing.tracks.{run}") for run, folder in c.obj(h.get("tracks") or {},
                                                                                       "healing.tracks").items()}
    return Healing(
        **texts, **counts, **numbers,  # type: ignore[arg-type]
        control_train_loss=_losses(c, h.get("control_train_loss"), "healing.control_train_loss"),
        runs=tuple(_healed(c, r, f"healing.runs[{i}]", layers, heads, counts["steps"])
                   for i, r in enumerate(_items(c, h.get("runs"), "healing.runs", null=False))),
        tracks=tracks,  # type: ignore[arg-type]
        notes=tuple(c.text(n, f"healing.notes[{i}]") for i, n in enumerate(_items(c, h.get("notes"), "healing.notes"))),
        eval_every=c.index(h.get("eval_every"), "healing.eval_every", null=True, below=MAX_COUNT),
        control_curve=_curve(c, h.get("control_curve"), "healing.control_curve"),
        precision=_precision(c, h.get("precision")), device=c.text(h.get("device", "cpu"), "healing.device"),
        step_seconds=c.number(h.get("step_seconds"), "healing.step_seconds", low=0),
        control_late=_late(c, h.get("control_late"), "healing.control_late", counts["steps"]))

# The two verbs every capability's saved module offers (qkinspect.capabilities): read one back, and whether a
# model argument is one of its own. The names above stay, as they were published.
read = read_experiment


def is_saved(spec: object) -> bool:
    """Whether the model argument `spec` names an experiment document (`qkinspect experiment -o FILE.json`; its
    first 4 KiB only). `plot` and `report` take one from --experiment, never as the model argument, so the contract
    names no predicate for it (qkinspect.capabilities): this one is for a caller's own use."""
    return declares_kind(spec, "experiment")
