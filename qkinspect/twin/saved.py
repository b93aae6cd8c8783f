"""Read a twin folder back, checked (it is untrusted input: a folder someone sent, or one a run left half
written), into the records `qkinspect.twin` returns (qkinspect.twin.results). The files are read through the twin
folder's one module (qkinspect.twin.folder: bounded, links refused) and each value checked with the house's
`qkinspect.checking.Checker`: one InputError naming the file and the key. A run file that does not belong to the
folder's setup (another resume key) is left out and said in the notes.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from qkinspect.checking import Checker, show
from qkinspect.errors import InputError
from qkinspect.twin.folder import MANIFEST, RUN_KIND, is_twin_folder, read_manifest, read_run, run_files, run_path
from qkinspect.twin.request import INITS, LEGACY
from qkinspect.twin.results import (
    Failure,
    LrTrial,
    RunPoint,
    TrajectoryPoint,
    TwinResult,
    TwinRun,
    VariantSummary,
)
from qkinspect.twin.summary import best_lr, compare, edge_notes, steps_to

MAX_ITEMS = 1 << 24  # points, trajectory rows or failures in one document
MAX_TEXT = 10_000  # characters of a name, metric, error or note

__all__ = ["is_saved", "is_twin_folder", "read", "read_twin"]


def read_twin(folder: str | Path) -> TwinResult:
    """The records of every run in the twin folder `folder`, with the per-variant summary of its plan."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    c = Checker(folder / MANIFEST)
    key = _text(c, manifest.get("key"), "key")
    plan = c.obj(manifest.get("plan"), "plan")
    setup = c.obj(manifest.get("setup"), "setup")
    variants = [_text(c, v, f"plan.variants[{i}]") for i, v in enumerate(_list(c, plan.get("variants"),
                                                                                  "plan.variants"))]
    seeds = c.index(plan.get("seeds"), "plan.seeds", null=False)
    lrs = [c.number(x, f"plan.lrs[{i}]", null=False) for i, x in enumerate(_list(c, plan.get("lrs"), "plan.lrs"))]
    margin = c.number(plan.get("margin"), "plan.margin", null=False)
    training = setup.get("training")
    if isinstance(training, dict):  # a folder written before --init and --schedule: what the twin did then
        setup = {**setup, "training": {**LEGACY, **training}}
    # the plan as checked, beside the setup: the figures draw its margin
    setup = {**setup, "plan": {"variants": variants, "seeds": seeds, "lrs": [float(x) for x in lrs],
                               "margin": float(margin)}}
    runs, points, trajectories, notes = [], [], [], []
    for path in run_files(folder):
        rc = Checker(path)
        doc = rc.obj(read_run(path), "(top level)")
        if doc.get("kind") != RUN_KIND or doc.get("key") != key:
            notes.append(f"{path.name}: written for another setup; left out")
            continue
        run, pts, traj = check_run(rc, doc.get("run"))
        runs.append(run)
        points += pts
        trajectories += traj
    failures = []
    for i, f in enumerate(_list(c, manifest.get("failures", []), "failures")):
        where = f"failures[{i}]"
        f = c.obj(f, where)
        failures.append(Failure(_text(c, f.get("variant"), f"{where}.variant"),
                                c.index(f.get("seed"), f"{where}.seed", null=False),
                                float(c.number(f.get("lr"), f"{where}.lr", null=False)),
                                _text(c, f.get("error"), f"{where}.error")))
    text = setup.get("text")
    if isinstance(text, dict) and text.get("demo") is True:
        notes.insert(0, "no text given: trained on Python's own pydoc_data.topics, a demo")
    # what a saved checkpoint cannot say (only where one was saved), once a variant, not once a run
    notes += list(dict.fromkeys(f"{r.variant}: {r.note}" for r in runs if r.note and r.checkpoint))
    order = {v: i for i, v in enumerate(variants)}  # the plan's order, then seed and rate; others after

    def rank(r) -> tuple:
        return (order.get(r.variant, len(order)), r.variant, r.seed, r.lr)

    runs.sort(key=rank)
    points.sort(key=lambda p: (*rank(p), p.step))
    trajectories.sort(key=lambda t: (*rank(t), t.step, t.layer, t.head, t.metric))
    sweep, chosen = _lr_sweep(runs, variants, setup["plan"]["lrs"])
    notes += edge_notes(chosen, setup["plan"]["lrs"])
    bpb = bits_per_byte(setup)
    if bpb is not None:
        points = [replace(p, val_bpb=p.val_loss * bpb) for p in points]
        runs = [replace(r, val_bpb=r.val_loss * bpb) for r in runs]
    summaries = _summaries(runs, points, variants, seeds, chosen, setup["plan"]["margin"], bpb)
    setup = {**setup, "statistics": statistics_said(summaries)}
    return TwinResult(folder, setup, tuple(runs), tuple(points), tuple(trajectories), summaries, sweep,
                      tuple(failures), tuple(notes))


def check_run(c: Checker, doc: Any) -> tuple[TwinRun, list[RunPoint], list[TrajectoryPoint]]:
    """A run file's `run`, checked whole: its record, its evaluations and its trajectory rows."""
    doc = c.obj(doc, "run")
    variant, seed = _text(c, doc.get("variant"), "run.variant"), c.index(doc.get("seed"), "run.seed", null=False)
    lr = float(c.number(doc.get("lr"), "run.lr", null=False))
    params = c.index(doc.get("params"), "run.params", null=False, below=1 << 62)
    pts = []
    for i, p in enumerate(_list(c, doc.get("points"), "run.points")):
        w = f"run.points[{i}]"
        p = c.obj(p, w)
        train = c.number(p.get("train_loss"), f"{w}.train_loss")
        pts.append(RunPoint(variant, seed, lr, c.index(p.get("step"), f"{w}.step", null=False, below=1 << 62),
                            c.index(p.get("tokens"), f"{w}.tokens", null=False, below=1 << 62),
                            None if train is None else float(train),
                            float(c.number(p.get("val_loss"), f"{w}.val_loss", null=False)), params,
                            float(c.number(p.get("seconds"), f"{w}.seconds", null=False))))
    if not pts:
        raise c.fail("run.points", "is empty; a run has at least one evaluation")
    traj = []
    for i, t in enumerate(_list(c, doc.get("trajectory", []), "run.trajectory")):
        w = f"run.trajectory[{i}]"
        t = c.obj(t, w)
        value = c.number(t.get("value"), f"{w}.value")
        traj.append(TrajectoryPoint(variant, seed, lr, c.index(t.get("step"), f"{w}.step", null=False, below=1 << 62),
                                    c.index(t.get("layer"), f"{w}.layer", null=False),
                                    c.index(t.get("head"), f"{w}.head", null=False),
                                    _text(c, t.get("metric"), f"{w}.metric"), None if value is None else float(value)))
    checkpoint = c.text(doc.get("checkpoint"), "run.checkpoint", null=True)
    note = c.text(doc.get("note"), "run.note", null=True)
    step_seconds = c.number(doc.get("step_seconds"), "run.step_seconds")
    run = TwinRun(variant, seed, lr, params, pts[-1].val_loss, pts[-1].train_loss,
                  float(c.number(doc.get("seconds"), "run.seconds", null=False)),
                  None if step_seconds is None else float(step_seconds),
                  float(c.number(doc.get("violation"), "run.violation", null=False)), checkpoint, note,
                  c.index(doc.get("threads"), "run.threads", null=False),
                  _choice(c, doc.get("init", LEGACY["init"]), "run.init", INITS))
    return run, pts, traj


def _lr_sweep(runs: list[TwinRun], variants: list[str], lrs: list[float]):
    """Seed 0's final held-out loss per (variant, lr) and each variant's chosen rate (the lowest; the only one
    where one was given)."""
    trials, chosen = [], {}
    for v in variants:
        losses = {r.lr: r.val_loss for r in runs if r.variant == v and r.seed == 0 and r.lr in lrs}
        if len(lrs) == 1:
            chosen[v] = lrs[0]
        elif (best := best_lr(losses)) is not None:
            chosen[v] = best
        trials += [LrTrial(v, x, losses.get(x), chosen.get(v) == x) for x in lrs] if len(lrs) > 1 else []
    return tuple(trials), chosen


def bits_per_byte(setup: dict[str, Any]) -> float | None:
    """The factor from nats per token to bits per byte of the held-out text: held-out tokens ÷ held-out UTF-8
    bytes ÷ ln 2 (None where the setup does not say its bytes: a folder written before they were recorded)."""
    text = setup.get("text")
    tokens = text.get("held_out_tokens") if isinstance(text, dict) else None
    size = text.get("held_out_bytes") if isinstance(text, dict) else None
    ok = all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (tokens, size))
    return tokens / size / math.log(2) if ok else None


def statistics_said(summaries: tuple[VariantSummary, ...]) -> dict[str, Any]:
    """What the summary's statistics are, as the JSON says it (`setup.statistics`) and the table's caption."""
    from qkinspect.twin.summary import ALPHA, LEVEL, PER_STEPS, SLOPE_EVALS

    family = sum(s.p_one_sided_better is not None for s in summaries)
    return {"interval": f"{LEVEL:.0%} t-interval of the paired difference: the two one-sided tests at {ALPHA:.0%} "
                        "against the margin",
            "p_values": "one-sided p-values of those tests (not probabilities of the claims)",
            "multiple_comparisons": (f"Holm over the {family} constrained variants tested, each test's family; "
                                     "the verdict uses the adjusted p-values (p_holm_*)" if family > 1 else
                                     "none: one variant tested (p_holm_* = p_one_sided_*)"),
            "variants_tested": family,
            "slope": f"the paired gap's least-squares slope per {PER_STEPS} steps over the last {SLOPE_EVALS} "
                     f"evaluations after step 0, mean over seeds with its {LEVEL:.0%} t-interval",
            "bits_per_byte": "nats per token × held-out tokens ÷ held-out UTF-8 bytes ÷ ln 2"}


def _summaries(runs, points, variants, seeds, chosen, margin, bpb) -> tuple[VariantSummary, ...]:
    from qkinspect.twin.summary import corrected, gap_slope

    def at(v: str) -> dict[int, TwinRun]:
        return {r.seed: r for r in runs if r.variant == v and r.lr == chosen.get(v) and r.seed < seeds}

    def by_seed(v: str) -> dict[int, dict[int, float]]:
        out: dict[int, dict[int, float]] = {}
        for p in points:
            if p.variant == v and p.lr == chosen.get(v) and p.seed < seeds:
                out.setdefault(p.seed, {})[p.step] = p.val_loss
        return out

    def curve(v: str) -> dict[int, float]:
        by: dict[int, list[float]] = {}
        for c in by_seed(v).values():
            for k, x in c.items():
                by.setdefault(k, []).append(x)
        n = len(at(v))
        return {k: sum(x) / len(x) for k, x in by.items() if len(x) == n}

    def in_bits(x: float | None) -> float | None:
        return None if x is None or bpb is None else x * bpb

    std = at("standard")
    std_curve, std_seeds = curve("standard"), by_seed("standard")
    target = std_curve[max(std_curve)] if std_curve else None
    rows = []
    for v in variants:
        mine = at(v)
        if not mine:
            continue
        order = sorted(mine)
        paired = compare([] if v == "standard" else [mine[s].val_loss - std[s].val_loss for s in order if s in std],
                         margin)
        gaps = [{k: x - std_seeds[s][k] for k, x in c.items() if k in std_seeds[s]}
                for s, c in sorted(by_seed(v).items()) if s in mine and s in std_seeds]
        rows.append((v, mine, order, paired, gap_slope([] if v == "standard" else gaps)))
    holm = iter(corrected([paired for v, *_, paired, _ in rows if v != "standard"]))
    out = []
    for v, mine, order, paired, slope in rows:
        losses = tuple(mine[s].val_loss for s in order)
        mean = sum(losses) / len(losses)
        if v == "standard":
            adjusted, verdict, diff, steps = (None, None, None), "reference", 0.0, None
        else:
            c = next(holm)
            adjusted, verdict = (c.p_holm_better, c.p_holm_not_worse, c.p_holm_worse), c.verdict
            diff, steps = paired.diff, steps_to(curve(v), target)
        out.append(VariantSummary(
            v, mine[order[0]].params, chosen[v], len(order), mine[order[0]].init, mean, losses, in_bits(mean),
            diff, paired.ci_low, paired.ci_high, in_bits(diff), paired.p_one_sided_better,
            paired.p_one_sided_not_worse, paired.p_one_sided_worse, *adjusted, verdict, steps, slope.slope,
            slope.low, slope.high, slope.start))
    return tuple(out)


# -- checked values ------------------------------------------------------------------------------------------


def _list(c: Checker, x: Any, key: str) -> list:
    if not isinstance(x, list) or len(x) > MAX_ITEMS:
        raise c.fail(key, f"is {show(x)}, not a list")
    return x


def _text(c: Checker, x: Any, key: str) -> str:
    value = c.text(x, key)
    if len(value) > MAX_TEXT:
        raise c.fail(key, f"is {len(value)} characters long; at most {MAX_TEXT}")
    return value


def _choice(c: Checker, x: Any, key: str, allowed: tuple[str, ...]) -> str:
    if x not in allowed:
        raise c.fail(key, f"is {show(x)}, not {' or '.join(allowed)}")
    return x


def done(folder: Path, variant: str, seed: int, lr: float, key: str) -> dict[str, Any] | None:
    """A finished run's document, where its file is in the folder for this setup; None where there is none, or
    what is there is not that run (it is trained again and its file replaced)."""
    path = run_path(folder, variant, seed, lr)
    if not os.path.lexists(path):
        return None
    try:
        doc = read_run(path)
        ok = isinstance(doc, dict) and doc.get("kind") == RUN_KIND and doc.get("key") == key
        run = check_run(Checker(path), doc.get("run"))[0] if ok else None
    except InputError:
        return None
    return doc if run is not None and (run.variant, run.seed, run.lr) == (variant, seed, lr) else None


# The two verbs every capability's saved module offers (qkinspect.capabilities): read one back, and whether a
# model argument is one of its own. The names above stay, as they were published.
read = read_twin
is_saved = is_twin_folder
