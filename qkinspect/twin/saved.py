"""Read a twin folder back, checked (it is untrusted input: a folder someone sent, or one a run left half
written), into the records `qkinspect.twin` returns (qkinspect.twin.results). Each bad value is one InputError
naming the file and the key; a run file that does not belong to the folder's setup (another resume key) is left
out and said in the notes.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from qkinspect.errors import InputError
from qkinspect.twin.request import INITS, LEGACY
from qkinspect.twin.results import (
    FOLDER_KIND,
    MANIFEST,
    RUN_KIND,
    RUNS,
    Failure,
    LrTrial,
    RunPoint,
    TrajectoryPoint,
    Twin,
    TwinRun,
    VariantSummary,
)
from qkinspect.twin.summary import best_lr, compare, steps_to

MAX_FILE = 1 << 28  # 256 MiB: a run file larger than this is not one qkinspect wrote


def is_twin_folder(path: Any) -> bool:
    return isinstance(path, (str, Path)) and (Path(path) / MANIFEST).is_file()


def read_twin(folder: str | Path) -> Twin:
    """The records of every run in the twin folder `folder`, with the per-variant summary of its plan."""
    folder = Path(folder)
    manifest = _json(folder / MANIFEST)
    where = folder / MANIFEST
    _expect(manifest.get("kind") == FOLDER_KIND, where, "kind", "not a twin folder's manifest")
    key = _str(manifest, "key", where)
    plan = _dict(manifest, "plan", where)
    setup = _dict(manifest, "setup", where)
    variants = [_s(v, where, "plan.variants") for v in _list(plan, "variants", where)]
    seeds = _int(plan, "seeds", where)
    lrs = [_num(x, where, "plan.lrs") for x in _list(plan, "lrs", where)]
    margin = _num(plan.get("margin"), where, "plan.margin")
    training = setup.get("training")
    if isinstance(training, dict):  # a folder written before --init and --schedule: what the twin did then
        setup = {**setup, "training": {**LEGACY, **training}}
    # the plan as checked, beside the setup: the figures draw its margin
    setup = {**setup, "plan": {"variants": variants, "seeds": seeds, "lrs": lrs, "margin": margin}}
    runs, points, trajectories, notes = [], [], [], []
    for path in sorted((folder / RUNS).glob("*.json")) if (folder / RUNS).is_dir() else []:
        doc = _json(path)
        if doc.get("kind") != RUN_KIND or doc.get("key") != key:
            notes.append(f"{path.name}: written for another setup; left out")
            continue
        run, pts, traj = _run(_dict(doc, "run", path), path)
        runs.append(run)
        points += pts
        trajectories += traj
    failures = tuple(Failure(_s(f.get("variant"), where, "failures.variant"), int(_num(f.get("seed"), where,
                     "failures.seed")), _num(f.get("lr"), where, "failures.lr"), _s(f.get("error"), where,
                     "failures.error")) for f in _list(manifest, "failures", where, default=[]) if isinstance(f, dict))
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
    sweep, chosen = _lr_sweep(runs, variants, lrs)
    bpb = bits_per_byte(setup)
    if bpb is not None:
        points = [replace(p, val_bpb=p.val_loss * bpb) for p in points]
        runs = [replace(r, val_bpb=r.val_loss * bpb) for r in runs]
    summaries = _summaries(runs, points, variants, seeds, chosen, margin, bpb)
    setup = {**setup, "statistics": statistics_said(summaries)}
    return Twin(folder, setup, tuple(runs), tuple(points), tuple(trajectories), summaries, sweep, failures,
                tuple(notes))


def _run(doc: dict[str, Any], where: Path) -> tuple[TwinRun, list[RunPoint], list[TrajectoryPoint]]:
    variant, seed, lr = _str(doc, "variant", where), _int(doc, "seed", where), _num(doc.get("lr"), where, "lr")
    params = _int(doc, "params", where)
    pts = []
    for p in _list(doc, "points", where):
        _expect(isinstance(p, dict), where, "points", "each point is an object")
        pts.append(RunPoint(variant, seed, lr, _int(p, "step", where), _int(p, "tokens", where),
                            _opt(p.get("train_loss"), where, "points.train_loss"),
                            _num(p.get("val_loss"), where, "points.val_loss"), params,
                            _num(p.get("seconds"), where, "points.seconds")))
    _expect(bool(pts), where, "points", "a run has at least one evaluation")
    traj = []
    for t in _list(doc, "trajectory", where, default=[]):
        _expect(isinstance(t, dict), where, "trajectory", "each row is an object")
        traj.append(TrajectoryPoint(variant, seed, lr, _int(t, "step", where), _int(t, "layer", where),
                                    _int(t, "head", where), _str(t, "metric", where),
                                    _opt(t.get("value"), where, "trajectory.value")))
    checkpoint = doc.get("checkpoint")
    note = doc.get("note")
    _expect(checkpoint is None or isinstance(checkpoint, str), where, "checkpoint", "a folder name or null")
    _expect(note is None or isinstance(note, str), where, "note", "text or null")
    run = TwinRun(variant, seed, lr, params, pts[-1].val_loss, pts[-1].train_loss, _num(doc.get("seconds"), where,
                  "seconds"), _opt(doc.get("step_seconds"), where, "step_seconds"),
                  _num(doc.get("violation"), where, "violation"), checkpoint, note, _int(doc, "threads", where),
                  _choice(doc.get("init", LEGACY["init"]), where, "init", INITS))
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


def _json(path: Path) -> dict[str, Any]:
    try:
        if path.stat().st_size > MAX_FILE:
            raise InputError(f"{path}: larger than a twin file can be")
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file (not a twin folder?)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: not readable as JSON ({e})") from None
    _expect(isinstance(doc, dict), path, "(top level)", "an object")
    return doc


def _expect(ok: bool, where: Path, key: str, what: str) -> None:
    if not ok:
        raise InputError(f"{where}: {key}: {what}")


def _dict(doc: dict, key: str, where: Path) -> dict[str, Any]:
    v = doc.get(key)
    _expect(isinstance(v, dict), where, key, "expected an object")
    return v


def _list(doc: dict, key: str, where: Path, default: Any = None) -> list:
    v = doc.get(key, default)
    _expect(isinstance(v, list), where, key, "expected a list")
    return v


def _choice(v: Any, where: Path, key: str, allowed: tuple[str, ...]) -> str:
    _expect(v in allowed, where, key, f"expected {' or '.join(allowed)}")
    return v


def _s(v: Any, where: Path, key: str) -> str:
    _expect(isinstance(v, str) and len(v) < 10_000, where, key, "expected text")
    return v


def _str(doc: dict, key: str, where: Path) -> str:
    return _s(doc.get(key), where, key)


def _int(doc: dict, key: str, where: Path) -> int:
    v = doc.get(key)
    _expect(isinstance(v, int) and not isinstance(v, bool) and v >= 0, where, key, "expected a whole number")
    return v


def _num(v: Any, where: Path, key: str) -> float:
    _expect(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v), where, key,
            "expected a finite number")
    return float(v)


def _opt(v: Any, where: Path, key: str) -> float | None:
    return None if v is None else _num(v, where, key)
