"""`run_experiment`: edit heads of a trained model, run it on text, and record what each edit costs.

Per run: one edit applied to one head (scope "head"), to the chosen heads of one layer ("layer"), or to the chosen
heads of every chosen layer at once ("model"); the model is run from the first edited layer on (the states entering
it come from one unedited pass) and restored exactly before the next run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from qkinspect.errors import CheckpointError, InputError, UnsupportedModelError
from qkinspect.experiment.amounts import check_amounts, check_estimate
from qkinspect.experiment.edits import PREDICTORS, Edit, apply_edit, parse_edit
from qkinspect.experiment.heal import Healing, HealOptions, check_healable, heal_runs
from qkinspect.experiment.hf import load_hf, written
from qkinspect.experiment.hf_guard import boundary, check_token_ids
from qkinspect.experiment.in_memory import hf_in_memory, keeps_mode
from qkinspect.experiment.measure import Scorer, Text, default_text, read_text, windows
from qkinspect.layer import AttentionLayer, ModelInfo
from qkinspect.notebook import Tabular
from qkinspect.progress import phase

SCOPES = ("head", "layer", "model")
REFERENCE = Edit("ablate")
# A difference is "beyond its error" when it is at least this many standard errors from 0 (about 95 %, two-sided).
SIGNIFICANT = 2.0
# Per-head claims need about a thousand scored tokens (docs/experiments.md, "Error bars"): 1024 tokens in windows of
# 256 score 1020 predictions.
MIN_SCORED = 1000
VERIFY = 12  # --estimate: heads per edit run exactly to check it, unless --verify says otherwise


@dataclass(frozen=True)
class Run:
    """One edited model and its loss. `layer`/`head` are None where the scope covers more than one."""

    edit: str
    scope: str
    layer: int | None
    head: int | None
    heads: int  # how many heads the run edited
    loss: float | None  # None: not run exactly (an estimated head that was not verified)
    dloss: float | None  # loss - baseline
    # dloss / dloss of `ablate` on the same heads; None without that run, or when ablating does not cost loss
    # beyond its error (dloss(ablate) <= SIGNIFICANT standard errors)
    ratio: float | None
    predicted: float | None  # the weight-space figure PREDICTORS[edit] (mean over the edited heads)
    offset0: bool  # a rotary edit that is exact at offset 0 only
    seconds: float  # the whole run: edit, write-back, forward from the first edited layer
    forward_seconds: float  # the forward alone
    dloss_se: float | None = None  # the standard error of dloss (paired with the baseline, block-clustered)
    # --estimate (qkinspect.experiment.estimate): the estimated dloss, its Monte-Carlo standard error, how far the
    # edit moves the head's output (|Δo_h| / |o_h|) and whether that makes the estimate unreliable
    dloss_estimate: float | None = None
    dloss_estimate_se: float | None = None
    moved: float | None = None
    unreliable: bool | None = None


@dataclass(frozen=True)
class ExperimentResult(Tabular):
    """Everything an experiment measured; `runs` in the order they ran (unit by unit, edit by edit). In a notebook
    it shows `qkinspect experiment`'s table; `to_pandas()` is a row per run (qkinspect.notebook)."""

    model: ModelInfo
    measure: str  # "causal", "masked" or "drift" (MEASURES names them)
    text: str
    tokens: int  # tokens fed to the model per pass
    scored: int  # predictions (causal), masked tokens (masked) or tokens (drift) per pass
    windows: int
    window: int
    baseline: float
    runs: tuple[Run, ...]
    rotary: str
    baseline_seconds: float
    seconds: float  # all edit runs together
    predictors: dict[str, str] = field(default_factory=dict)
    healing: Healing | None = None  # with heal=: the edits after fine-tuning, against a control (experiment.heal)
    estimate: Estimate | None = None  # --estimate: how it was made and how well it agreed with the exact runs

    def table_document(self):
        """`qkinspect experiment`'s document of this result (its CSV rows and its table)."""
        from qkinspect.cli.commands.experiment import experiment_document

        return experiment_document(self)


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
    probes: int
    seconds: float  # the estimate of every head and edit (edits, reruns, backward passes)
    verify_seconds: float  # the exact runs of the verified heads
    agreement: tuple[Agreement, ...]


@keeps_mode
def run_experiment(
    model: str | Path | None = None,
    edits: str | Sequence[str] = "share_qk",
    *,
    scope: str = "head",
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    text: str | Path | Text | None = None,
    tokens: int = 4096,
    window: int = 512,
    reference: bool = True,
    rotary: str = "gauge",
    tokenizer=None,
    revision: str | None = None,
    batch_tokens: int = 2048,
    seed: int = 0,
    progress: Callable[..., None] | None = None,
    heal: int | HealOptions | None = None,
    device: str | None = None,
    estimate: bool = False,
    probes: int | None = None,
    verify: int | None = None,
) -> ExperimentResult:
    """Edit heads of `model` and measure the loss on text, one run per (unit, edit).

    Args:
        model: a model spec as for `qkinspect.load` (None: the demo model), or a transformers model in memory
            (or a (config, state_dict) pair), which is edited in place and left exactly as it was: every module
            swapped for an edit is swapped back, and each module's training flag is restored (it runs in eval
            mode). Give `tokenizer` with a model in memory.
        edits: "share_qk,rank:8" or a list of edit texts (docs/experiments.md, Edits).
        scope: "head" (each head alone), "layer" (the chosen heads of a layer together) or "model" (all at once).
        layers, heads: the selection (default: all).
        text: a file, a `Text`, or None for `pydoc_data.topics`.
        tokens, window: the first `tokens` tokens, cut into windows of `window`.
        reference: also run `ablate` on the same units, for Δloss / Δloss(ablate).
        rotary: "gauge" (edits exact at every offset) or "offset0" (see `apply_edit`).
        tokenizer: a tokenizer, or a folder / vocab.txt to read one from (default: the model's own).
        progress: a progress receiver (qkinspect.progress): told each phase (loading, baseline, the exact runs
            in unit × edit, or the estimate's backward passes and verification, healing steps) and each unit done;
            a plain progress(done, total) callable is called after each unit of every phase.
        heal: fine-tuning steps (or a HealOptions) after each edit, the edit kept as a parametrisation, beside an
            unedited control trained the same way (qkinspect.experiment.heal; docs/training.md). Default: none.
        device: where the model runs, "cpu", "cuda" or "cuda:N" (default: the CPU, or where a model in memory
            already is; it is not moved); the edits are computed on the CPU and written into the model's modules
            on its device.
        estimate: estimate every head x edit (qkinspect.experiment.estimate; scope "head" only) instead of running
            each exactly: `dloss_estimate`, `dloss_estimate_se`; `dloss` only on the verified heads.
        probes: K, the backward passes with sampled labels the estimate's curvature term averages (default
            estimate.PROBES).
        verify: with `estimate`, run this many heads per edit exactly (the predicted cheapest and costliest, the
            flagged, and a random sample) and report the rank agreement (`ExperimentResult.estimate.agreement`);
            None: VERIFY with `estimate`; 0 checks nothing.

    Returns:
        ExperimentResult.

    Raises:
        InputError and its subclasses: bad options, unsupported models, edits not defined for a layer.

    Example:
        >>> r = run_experiment("SmolLM2.gguf", "share_qk", layers=[3], tokens=512)  # doctest: +SKIP
        >>> [(x.head, round(x.dloss, 3)) for x in r.runs if x.edit == "share_qk"]  # doctest: +SKIP
    """
    chosen = _parse_edits(edits)
    if scope not in SCOPES:
        raise InputError(f"--scope {scope!r}: expected one of {', '.join(SCOPES)}")
    if rotary not in ("gauge", "offset0"):
        raise InputError(f"--rotary {rotary!r}: expected gauge or offset0")
    check_amounts(tokens, window)
    check_estimate(scope, estimate, probes, verify)
    verify = (VERIFY if estimate else 0) if verify is None else verify
    from qkinspect.analysis import _check_device

    device = None if device is None else _check_device(device)
    source = text if isinstance(text, Text) else default_text() if text is None else read_text(text, tokens)
    opts = heal if isinstance(heal, HealOptions) or not heal else HealOptions(steps=heal, seed=seed)
    if opts:
        opts.check()  # before any work
        if estimate:
            raise InputError("--heal runs every edit exactly: it cannot be combined with --estimate")
    phase(progress, "loading the model")
    info, originals, hf = open_experiment(model, revision, layers, heads, tokenizer, device=device)
    if opts:
        check_healable(hf, rotary)
    spec = info.blocks[0]
    head_list = list(heads) if heads is not None else list(range(spec.n_heads))
    with boundary(hf.tokenizer_source, f"the tokenizer cannot read {source.name}", native=True):
        ids = windows(hf, source, tokens, window)
    fed = ids.unique().tolist()  # the ids the model will embed (the text's, and [CLS]/[SEP] around encoders')
    if hf.kind == "masked":
        if hf.tokenizer.mask_token_id is None:
            raise CheckpointError(f"{hf.tokenizer_source}: the tokenizer has no mask token, which a masked LM is "
                                  "measured with")
        fed.append(hf.tokenizer.mask_token_id)
    check_token_ids(fed, hf.model.get_input_embeddings().num_embeddings, hf.tokenizer_source)
    units = make_units(scope, sorted(originals), head_list)
    runs_edits = chosen + ([REFERENCE] if reference and REFERENCE not in chosen else [])
    with boundary(info.source, "transformers cannot run the model"):  # the unedited pass: the checkpoint's own
        scorer = Scorer(hf, ids, batch_tokens=batch_tokens, seed=seed)
        t0 = time.perf_counter()
        base = scorer.baseline(cache={_start(unit) for unit in units}, progress=progress)
        t_base = time.perf_counter() - t0
    if estimate:
        from qkinspect.experiment import estimate as est

        runs_e, summary = est.estimated_runs(scorer, originals, head_list, runs_edits, base, rotary=rotary,
                                             probes=probes or est.PROBES, verify=verify, seed=seed,
                                             progress=progress)
        return ExperimentResult(
            model=info, measure=hf.kind, text=source.name, tokens=scorer.tokens, scored=scorer.counted,
            windows=int(ids.shape[0]), window=int(ids.shape[1]), baseline=base, runs=tuple(_with_ratios(runs_e)),
            rotary=rotary, baseline_seconds=t_base, seconds=summary.seconds + summary.verify_seconds,
            predictors={str(e): PREDICTORS[e.name] for e in runs_edits}, estimate=summary)
    runs: list[Run] = []
    tick = phase(progress, "exact runs", len(units) * len(runs_edits), f"{scope} × edit")
    for unit in units:
        for edit in runs_edits:
            runs.append(run_unit(scorer, hf, originals, unit, edit, scope, base, rotary))
            tick(len(runs), status=str(edit))
    healing = None
    if heal:
        exact = {(r.edit, r.layer, r.head): r.dloss for r in runs}
        healing = heal_runs(hf, scorer, source, tokens, window, units, runs_edits, scope, rotary, exact, base, opts,
                            progress=progress)
    return ExperimentResult(
        model=info, measure=hf.kind, text=source.name, tokens=scorer.tokens, scored=scorer.counted,
        windows=int(ids.shape[0]), window=int(ids.shape[1]), baseline=base, runs=tuple(_with_ratios(runs)),
        rotary=rotary, baseline_seconds=t_base, seconds=sum(r.seconds for r in runs),
        predictors={str(e): PREDICTORS[e.name] for e in runs_edits}, healing=healing)


def _parse_edits(edits: str | Sequence[str]) -> list[Edit]:
    texts = edits.split(",") if isinstance(edits, str) else list(edits)
    out = list(dict.fromkeys(parse_edit(t) for t in texts if t.strip()))
    if not out:
        raise InputError("--edit: name at least one edit")
    return out


def open_experiment(model, revision, layers, heads, tokenizer, device: str | None = None):
    """The model's identity, its chosen layers in the canonical layout (qkinspect's loader), and the transformers
    model (the same files, through transformers' own classes)."""
    from qkinspect.loading import open_model

    with open_model(model, revision=revision) as m:
        info = m.info
        if len(info.blocks) != 1 or info.blocks[0].name not in ("encoder", "decoder"):
            keys = ", ".join(b.key for b in info.blocks)
            raise UnsupportedModelError(f"{info.source}: experiment runs models with one self-attention block; "
                                        f"this one has {keys}")
        spec = info.blocks[0]
        _check_range("layers", layers, spec.n_layers)
        _check_range("heads", heads, spec.n_heads)
        wanted = sorted(set(layers)) if layers is not None else list(range(spec.n_layers))
        originals = {i: m.layer(spec.key, i) for i in wanted}
        if m.info.format == "memory":
            hf = hf_in_memory(m.resolved, tokenizer)
            _check_in_place(hf, device)
        else:
            hf = load_hf(m.resolved, tokenizer, device=device or "cpu")
    if len(hf.layers) != spec.n_layers:
        raise UnsupportedModelError(f"{info.source}: transformers built {len(hf.layers)} layers, "
                                    f"the checkpoint has {spec.n_layers}")
    return info, originals, hf


def _check_in_place(hf, device: str | None) -> None:
    """A model in memory runs where it is: refuse a device= it is not on (moving it would change the caller's
    model)."""
    import torch

    here = next(hf.model.parameters()).device
    want = None if device is None else torch.device(device)
    if want is not None and (want.type != here.type or (want.index is not None and want.index != here.index)):
        raise InputError(f"device={device!r}: this model in memory is on {here}, and it runs where it is "
                         f"(move it first: model.to({device!r}))")


def _check_range(what: str, wanted: Sequence[int] | None, n: int) -> None:
    if wanted is not None and (not list(wanted) or min(wanted) < 0 or max(wanted) >= n):
        raise InputError(f"--{what} {','.join(map(str, wanted))}: this model has {what} 0-{n - 1}")


Unit = list[tuple[int, list[int]]]  # (layer, heads) pairs edited together in one run


def make_units(scope: str, layers: list[int], heads: list[int]) -> list[Unit]:
    if scope == "head":
        return [[(i, [h])] for i in layers for h in heads]
    if scope == "layer":
        return [[(i, heads)] for i in layers]
    return [[(i, heads) for i in layers]]


def _start(unit: Unit) -> int:
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
        loss = scorer.score(start=_start(unit) if start is None else start)
        t_forward = time.perf_counter() - t1
    figures = [v for r in results for v in r.predicted.values()]
    return Run(
        edit=str(edit), scope=scope, layer=unit[0][0] if scope != "model" else None,
        head=unit[0][1][0] if scope == "head" else None,
        heads=len(figures), loss=loss, dloss=loss - base, ratio=None,
        predicted=sum(figures) / len(figures) if figures else None,
        offset0=any(r.offset0_only for r in results), seconds=time.perf_counter() - t0,
        forward_seconds=t_forward, dloss_se=scorer.paired_se())


def beyond_error(dloss: float | None, se: float | None) -> bool:
    """Whether `dloss` is further than SIGNIFICANT standard errors from 0 (False without a standard error)."""
    return dloss is not None and se is not None and abs(dloss) > SIGNIFICANT * se


def _with_ratios(runs: list[Run]) -> list[Run]:
    """Each run's dloss / dloss(ablate) of the same unit, where ablating costs loss beyond its error (a ratio to a
    cost that is <= 0, or within its noise, is not a number)."""
    from dataclasses import replace

    ablate = {(r.layer, r.head): r for r in runs if r.edit == REFERENCE.name and r.dloss is not None}
    out = []
    for r in runs:
        a = ablate.get((r.layer, r.head))
        ok = a is not None and r.dloss is not None and a.dloss > 0 and beyond_error(a.dloss, a.dloss_se)
        out.append(replace(r, ratio=r.dloss / a.dloss if ok else None))
    return out
