"""The experiment's records, and its JSON document: what `run_experiment` returns (`ExperimentResult`, its `Run`s,
the estimate's `Estimate` and `Agreement`s, healing's `Healing`, `HealedRun`s and `HealPoint`s) and what
`qkinspect experiment` writes from them (`experiment_json`, `run_rows`), as `qkinspect.analysis.results` is for the
analysis.
`qkinspect.experiment.saved` reads the document back, checked, into the same records (what `plot` and `report`
draw); `qkinspect.experiment.costs` says what the runs cost per edit, per head and per K.

A record read back holds None where its document did not record a value (a document written by hand, or by an
older qkinspect); every field the writer fills is filled by a run.

Torch-free: the records hold Python numbers only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from qkinspect.documents import envelope, model_dict
from qkinspect.layer import ModelInfo
from qkinspect.notebook import Tabular

# A difference is "beyond its error" when it is at least this many standard errors from 0 (about 95 %, two-sided).
SIGNIFICANT = 2.0
# What each measure is, in words: the `measure` of an ExperimentResult (experiment.model.runtime's CAUSAL, MASKED
# and DRIFT), as the document names it.
MEASURES = {"causal": "next-token cross-entropy", "masked": "masked-LM cross-entropy", "drift": "drift"}
# Per-head claims need about a thousand scored tokens (docs/experiments.md, "Error bars"): 1024 tokens in windows of
# 256 score 1020 predictions.
MIN_SCORED = 1000


def beyond_error(dloss: float | None, se: float | None) -> bool:
    """Whether `dloss` is further than SIGNIFICANT standard errors from 0 (False without a standard error)."""
    return dloss is not None and se is not None and abs(dloss) > SIGNIFICANT * se


RHO_HEADS = 3  # Spearman's ρ needs this many points: fewer, and it is undefined


def too_few_to_rank(result: ExperimentResult) -> list[Agreement]:
    """The edits whose estimate was checked on fewer verified heads than Spearman's ρ needs (RHO_HEADS): ρ is
    undefined there, which the notes, the cost map and the report say."""
    e = result.estimate
    return [a for a in (e.agreement if e is not None else ()) if 0 < a.verified < RHO_HEADS]


def rank_correlation(x: list[float], y: list[float]) -> tuple[float, float] | None:
    """Spearman's rank correlation of `x` and `y` and its two-sided p-value (scipy's); None with fewer than 3
    points or a constant side, where ρ is undefined. The one Spearman of qkinspect: undefined is None (JSON null,
    "-" in tables), never NaN, so that no caller prints "nan" or compares with one."""
    if len(x) < RHO_HEADS or len(set(x)) < 2 or len(set(y)) < 2:
        return None
    from scipy.stats import spearmanr

    r = spearmanr(x, y)
    return float(r.statistic), float(r.pvalue)


def spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman's ρ of `x` and `y`; None where it is undefined (`rank_correlation`)."""
    r = rank_correlation(x, y)
    return None if r is None else r[0]


@dataclass(frozen=True)
class Run:
    """One edited model and its loss. `layer`/`head` are None where the scope covers more than one."""

    edit: str
    scope: str
    layer: int | None
    head: int | None
    heads: int | None  # how many heads the run edited
    loss: float | None  # None: not run exactly (an estimated head that was not verified)
    dloss: float | None  # loss - baseline
    # dloss / dloss of `ablate` on the same heads; None without that run, or when ablating does not cost loss
    # beyond its error (dloss(ablate) <= SIGNIFICANT standard errors)
    ratio: float | None
    predicted: float | None  # the weight-space figure PREDICTORS[edit] (mean over the edited heads)
    offset0: bool  # a rotary edit that is exact at offset 0 only
    seconds: float | None  # the whole run: edit, write-back, forward from the first edited layer
    forward_seconds: float | None  # the forward alone (not in the document: None when read back)
    dloss_se: float | None = None  # the standard error of dloss (paired with the baseline, block-clustered)
    # --estimate (qkinspect.experiment.estimate): the estimated dloss, its Monte-Carlo standard error, how far the
    # edit moves the head's output (|Δo_h| / |o_h|) and the residual stream (`reach`), the spot check's exact dloss
    # on part of the text where reach called for one (qkinspect.experiment.spot), and whether it found the estimate
    # unreliable (far below the spot check)
    dloss_estimate: float | None = None
    dloss_estimate_se: float | None = None
    moved: float | None = None
    unreliable: bool | None = None
    reach: float | None = None
    spot: float | None = None
    spot_se: float | None = None


@dataclass(frozen=True)
class ExperimentResult(Tabular):
    """Everything an experiment measured; `runs` in the order they ran (unit by unit, edit by edit). In a notebook
    it shows `qkinspect experiment`'s table; `to_pandas()` is a row per run (qkinspect.notebook)."""

    model: ModelInfo
    measure: str | None  # "causal", "masked" or "drift" (MEASURES names them)
    text: str | None
    tokens: int | None  # tokens fed to the model per pass
    scored: int | None  # predictions (causal), masked tokens (masked) or tokens (drift) per pass
    windows: int | None
    window: int | None
    baseline: float
    runs: tuple[Run, ...]
    rotary: str | None
    baseline_seconds: float | None
    seconds: float | None  # all edit runs together
    predictors: dict[str, str | None] = field(default_factory=dict)  # edit -> the weight-space figure it is
    healing: Healing | None = None  # with heal=: the edits after fine-tuning, against a control (experiment.heal)
    estimate: Estimate | None = None  # --estimate: how it was made and how well it agreed with the exact runs

    @property
    def measure_name(self) -> str | None:
        """The measure in words ("next-token cross-entropy"); None for a measure qkinspect does not know."""
        return MEASURES.get(self.measure or "")

    def table_rows(self) -> list[dict[str, Any]]:
        """The CSV's rows: one per run (`run_rows`)."""
        return run_rows(self)

    def reader_notes(self) -> list[str]:
        """What the reader must know (`notes`, then the healing's): `qkinspect experiment` prints them on stderr
        whatever -o is; a notebook shows them under the table."""
        return notes(self) + (list(self.healing.notes) if self.healing is not None else [])

    def render_table(self, console) -> None:
        """`qkinspect experiment`'s table of this result, as `-o FILE.txt` writes it (the notes go to stderr)."""
        from qkinspect.terminal.experiment import render_experiment

        render_experiment(console, self, run_rows(self), [])

    def _repr_html_(self) -> str:
        """A notebook's view: the table, then the notes (which the CLI prints on stderr)."""
        from qkinspect.notebook import html_table
        from qkinspect.terminal.experiment import render_experiment

        return html_table(lambda console: render_experiment(console, self, run_rows(self), self.reader_notes()))

    def document(self) -> dict[str, Any]:
        """The JSON document `qkinspect experiment -o FILE.json` writes (`experiment_json`); `save(path)` writes it."""
        return experiment_json(self)


@dataclass(frozen=True)
class Agreement:
    """How an edit's estimate agreed with its exact runs on the verified heads: Spearman's ρ over all of them
    (chosen to include the extremes, which makes ρ look better than over typical heads) and over the random part
    of the sample alone (None with fewer than 3 heads or a constant side)."""

    edit: str
    verified: int
    rho: float | None
    sampled: int
    rho_sampled: float | None


@dataclass(frozen=True)
class Estimate:
    """How the cost map was estimated, and how well it agreed with the exact runs of the verified heads."""

    probes: int | None  # backward passes with labels sampled from the model (the curvature term's K)
    seconds: float | None  # the estimate of every head and edit (edits, reruns, backward passes)
    verify_seconds: float | None  # the exact runs of the verified heads
    agreement: tuple[Agreement, ...]
    spot_tokens: int = 0  # the tokens each spot check scored (0: no head called for one)


@dataclass(frozen=True)
class HealPoint:
    """One evaluation of a healed model on the scored windows, `step` optimizer steps in (0: before any)."""

    step: int
    loss: float
    # an edited run: loss minus the control's loss at the same step (the edit's cost then); the control: loss minus
    # the unedited model's (what fine-tuning alone did)
    diff: float
    se: float | None  # standard error of diff, paired token by token, block-clustered as the exact runs' Δloss


@dataclass(frozen=True)
class HealChange:
    """How far a healed curve moved over the run's last quarter (qkinspect.experiment.heal_curve.late_change): the
    difference between two of its points, paired token by token. Near zero within its standard error: the curve has
    flattened; clearly negative: healing was still winning cost back when the run stopped."""

    start: int  # the step of the earlier point: the last one scored at or before three quarters of the steps
    end: int  # the last step
    change: float  # diff at `end` minus diff at `start` (an edited run: its cost; the control: its own gain)
    se: float | None  # standard error of `change`, block-clustered as the exact runs' Δloss; None: one block


@dataclass(frozen=True)
class Precision:
    """What healing's training steps computed in, and the measurement that decided it
    (qkinspect.experiment.heal_curve.choose_precision)."""

    dtype: str  # "float32" or "bfloat16" (autocast of the forward; parameters, optimizer and scoring float32)
    reason: str
    float32_loss: float | None = None  # the unedited float32 copy on the scored tokens
    bfloat16_loss: float | None = None  # the same under bfloat16 autocast
    threshold: float | None = None  # the smallest standard error among the experiment's exact runs


@dataclass(frozen=True)
class HealedRun:
    """One edit on one unit after healing, against the healed control."""

    edit: str
    scope: str
    layer: int | None
    head: int | None
    heads: int
    loss: float  # the edited model after healing, on the scored windows
    control_loss: float  # the control after healing, on the same windows
    diff: float  # loss - control_loss: the edit's cost after healing
    se: float | None  # standard error of diff (paired by token, block-clustered as the exact runs'); None: one block
    unhealed: float | None  # the edit's Δloss before healing (the exact run), for comparison
    recovered: float | None  # 1 - diff / unhealed: the share of the cost healing won back (control subtracted)
    violation: float  # the largest departure from the edit's set seen at any step (0 up to float rounding)
    train_loss: tuple[float, ...]  # training loss per step
    seconds: float
    curve: tuple[HealPoint, ...] = ()  # the run scored at step 0, every eval_every steps and at the last
    late: HealChange | None = None  # the cost's change over the last quarter (None: no point scored in between)


@dataclass(frozen=True)
class Healing:
    """The control and every healed run, and how they were trained."""

    steps: int
    train: str
    trained: str  # what `train` means, in words
    trained_parameters: int  # parameters the control trained
    parameters: int  # the model's parameters
    lr: float
    text: str
    train_tokens: int  # distinct training tokens (windows x window)
    batch_windows: int
    epochs: float  # how many times the training windows were gone through
    control_loss: float
    control_gain: float  # control_loss - baseline (negative: fine-tuning alone lowered the loss)
    control_train_loss: tuple[float, ...]
    runs: tuple[HealedRun, ...]
    seconds: float
    tracks: dict[str, str] = field(default_factory=dict)  # run name -> its sweep folder
    notes: tuple[str, ...] = ()
    eval_every: int | None = None
    control_curve: tuple[HealPoint, ...] = ()  # the control scored at the same steps, against the unedited model
    precision: Precision | None = None  # what the training steps computed in, and why
    device: str = "cpu"
    step_seconds: float | None = None  # the median training step of the edited runs (forward, backward, update)
    control_late: HealChange | None = None  # the control's own change over the last quarter (as HealedRun.late)


# -- the JSON document ------------------------------------------------------------------------------------------

def experiment_json(result: ExperimentResult) -> dict[str, Any]:
    """The JSON document (`qkinspect experiment -f json`, docs/experiments.md#output): the model, what was measured
    on which text, the baseline, and every run."""
    rows = run_rows(result)
    body = {
        "model": model_dict(result.model),
        "measure": {"kind": result.measure, "name": result.measure_name, "text": result.text,
                    "tokens": result.tokens, "scored": result.scored, "windows": result.windows,
                    "window": result.window, "rotary": result.rotary},
        "baseline": result.baseline,
        "predictors": result.predictors,
        "timing": {"baseline_seconds": result.baseline_seconds, "runs_seconds": result.seconds},
        "estimate": estimate_dict(result),
        "notes": notes(result),
        "runs": [{k: v for k, v in r.items() if k not in ("model", "measure")} for r in rows],
    }
    if result.healing is not None:
        body["healing"] = healing_json(result.healing)
    return envelope("experiment", **body)


def save_experiment(result: ExperimentResult, path: str | Path) -> None:
    """Write `experiment_json(result)` to `path` as `qkinspect experiment -o FILE.json` does (atomically, NaN as
    null): what `plot --kind experiment` and `report --experiment` read back (`qkinspect.experiment.saved`)."""
    result.save(path)  # the one JSON layout (`experiment -o` writes it too)


def run_rows(result: ExperimentResult) -> list[dict[str, Any]]:
    """One tidy row per run (the CSV and NDJSON rows)."""
    return [{"model": result.model.name, "measure": result.measure, "edit": r.edit, "scope": r.scope,
             "layer": r.layer, "head": r.head, "heads": r.heads, "loss": r.loss, "dloss": r.dloss,
             "dloss_se": r.dloss_se, "dloss_ratio_ablate": r.ratio, "dloss_estimate": r.dloss_estimate,
             "dloss_estimate_se": r.dloss_estimate_se, "moved": r.moved, "unreliable": r.unreliable,
             "reach": r.reach, "spot": r.spot, "spot_se": r.spot_se,
             "predicted": r.predicted, "predictor": result.predictors.get(r.edit), "offset0_only": r.offset0,
             "seconds": r.seconds} for r in result.runs]


def estimate_dict(result: ExperimentResult) -> dict[str, Any] | None:
    """The JSON `estimate` object: how the estimate was made and its agreement with the verified heads."""
    e = result.estimate
    if e is None:
        return None
    return {"probes": e.probes, "seconds": e.seconds, "verify_seconds": e.verify_seconds,
            "spot_tokens": e.spot_tokens,
            "agreement": [{"edit": a.edit, "verified": a.verified, "rho": a.rho, "sampled": a.sampled,
                           "rho_sampled": a.rho_sampled} for a in e.agreement]}


def notes(result: ExperimentResult) -> list[str]:
    """What the reader must know before trusting per-head numbers."""
    out = []
    if any(r.scope == "head" for r in result.runs) and result.scored is not None and result.scored < MIN_SCORED:
        out.append(f"only {result.scored} tokens were scored: per-head Δloss needs at least {MIN_SCORED} "
                   "to rise above its noise (score more tokens); read each against its standard error")
    if result.estimate is not None and not result.estimate.agreement:
        out.append("the estimate was not checked against exact runs (no head was verified)")
    if few := too_few_to_rank(result):
        counts = sorted({a.verified for a in few})
        out.append(f"{', '.join(a.edit for a in few)}: {' or '.join(map(str, counts))} verified "
                   f"head{'s' if counts != [1] else ''}, and Spearman's ρ between estimate and exact Δloss needs at "
                   f"least {RHO_HEADS}: it is undefined (verify {RHO_HEADS} or more heads; 10 or more give ρ an "
                   "interval)")
    return out


def healing_json(healing: Healing | None) -> dict[str, Any] | None:
    """The `healing` section of the experiment's JSON document."""
    if healing is None:
        return None
    out = asdict(healing)
    out["runs"] = [{k: v for k, v in r.items() if k != "train_loss"} | {"train_loss": list(r["train_loss"])}
                   for r in out["runs"]]
    out["control_train_loss"] = list(healing.control_train_loss)
    out["control_curve"] = [asdict(p) for p in healing.control_curve]
    return out
