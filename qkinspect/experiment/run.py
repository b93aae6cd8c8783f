"""`run_experiment`: edit heads of a trained model, run it on text, and record what each edit costs.

Per run: one edit applied to one head (scope "head"), to the chosen heads of one layer ("layer"), or to the chosen
heads of every chosen layer at once ("model"); the model is run from the first edited layer on (the states entering
it come from one unedited pass) and restored exactly before the next run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from qkinspect.experiment.edits.names import Edit
from qkinspect.experiment.requests import (
    LIBRARY_NAMES,
    ExperimentRequest,
    HealOptions,
    check_model,
    check_request,
    check_window,
)
from qkinspect.experiment.results import ExperimentResult, Run, beyond_error
from qkinspect.names import Names
from qkinspect.progress import phase

if TYPE_CHECKING:
    from qkinspect.experiment.requests import Text

REFERENCE = Edit("ablate")
VERIFY = 12  # --estimate: heads per edit run exactly to check it, unless --verify says otherwise


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
    names: Names = LIBRARY_NAMES,
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
        names: how errors name the options (`qkinspect.experiment.requests`): these arguments' names by default;
            the CLI passes its own.

    Every option is checked before anything is loaded, and the selection and the edits against the model's
    description (its config) before its weights are read.

    Returns:
        ExperimentResult.

    Raises:
        InputError and its subclasses: bad options, unsupported models, edits not defined for a layer.

    Example:
        >>> r = run_experiment("SmolLM2.gguf", "share_qk", layers=[3], tokens=512)  # doctest: +SKIP
        >>> [(x.head, round(x.dloss, 3)) for x in r.runs if x.edit == "share_qk"]  # doctest: +SKIP
    """
    request = check_request(edits, scope=scope, rotary=rotary, tokens=tokens, window=window, estimate=estimate,
                            probes=probes, verify=verify, heal=heal, device=device, seed=seed,
                            default_verify=VERIFY, names=names)
    from qkinspect.experiment.model.in_memory import eval_mode  # torch: only once the request is checked

    with eval_mode(model):  # a model in memory runs in eval mode and gets its modules' training flags back
        return _run(model, request, scope=scope, layers=layers, heads=heads, text=text, tokens=tokens,
                    window=window, reference=reference, rotary=rotary, tokenizer=tokenizer, revision=revision,
                    batch_tokens=batch_tokens, seed=seed, progress=progress, estimate=estimate, probes=probes,
                    names=names)


def _run(model, request: ExperimentRequest, *, scope: str, layers, heads, text, tokens: int, window: int,
         reference: bool, rotary: str, tokenizer, revision, batch_tokens: int, seed: int, progress, estimate: bool,
         probes: int | None, names: Names) -> ExperimentResult:
    """run_experiment once its request is checked."""
    import time
    from dataclasses import replace

    from qkinspect.errors import CheckpointError
    from qkinspect.experiment.exact import first_layer, make_units, run_unit
    from qkinspect.experiment.heal import check_healable, heal_runs
    from qkinspect.experiment.model.guard import check_token_ids
    from qkinspect.experiment.model.scoring import Scorer, default_text, read_text, windows
    from qkinspect.experiment.requests import Text
    from qkinspect.loading.boundary import boundary

    chosen, verify, device, opts = list(request.edits), request.verify, request.device, request.heal
    source = (text if isinstance(text, Text) else default_text() if text is None
              else read_text(text, tokens, what=names.text))
    if opts and opts.text is not None and not isinstance(opts.text, Text):
        opts = replace(opts, text=read_text(opts.text, what=names.heal_text))
    phase(progress, "loading the model")
    info, originals, hf = open_experiment(model, revision, layers, heads, tokenizer, device=device, edits=chosen,
                                          names=names, scope=scope, window=window)
    if opts:
        check_healable(hf, names)
    spec = info.blocks[0]
    head_list = list(heads) if heads is not None else list(range(spec.n_heads))
    with boundary(hf.tokenizer_source, f"the tokenizer cannot read {source.name}", native=True):
        ids = windows(hf, source, tokens, window, names)
    fed = ids.unique().tolist()  # the ids the model will embed (the text's, and [CLS]/[SEP] around encoders')
    if hf.kind == "masked":
        if hf.tokenizer.mask_token_id is None:
            raise CheckpointError(f"{hf.tokenizer_source}: the tokenizer has no mask token, which a masked LM is "
                                  "measured with")
        fed.append(hf.tokenizer.mask_token_id)
    check_token_ids(fed, hf.model.get_input_embeddings().num_embeddings, hf.tokenizer_source)
    units = make_units(scope, sorted(originals), head_list)
    if estimate:
        from qkinspect.experiment import estimate as est  # torch's autograd: only with --estimate

        est.check_sites(hf, sorted(originals), names.estimate)  # before any pass over the text
    runs_edits = chosen + ([REFERENCE] if reference and REFERENCE not in chosen else [])
    with boundary(info.source, "transformers cannot run the model"):  # the unedited pass: the checkpoint's own
        scorer = Scorer(hf, ids, batch_tokens=batch_tokens, seed=seed)
        t0 = time.perf_counter()
        base = scorer.baseline(cache={first_layer(unit) for unit in units}, progress=progress)
        t_base = time.perf_counter() - t0
    if estimate:
        runs_e, summary = est.estimated_runs(scorer, originals, head_list, runs_edits, base, rotary=rotary,
                                             probes=probes or est.PROBES, verify=verify, seed=seed,
                                             progress=progress)
        return ExperimentResult(
            model=info, measure=hf.kind, text=source.name, tokens=scorer.tokens, scored=scorer.counted,
            windows=int(ids.shape[0]), window=int(ids.shape[1]), baseline=base, runs=tuple(_with_ratios(runs_e)),
            rotary=rotary, baseline_seconds=t_base, seconds=summary.seconds + summary.verify_seconds,
            predictors=_predictors(runs_edits, originals), estimate=summary)
    runs: list[Run] = []
    tick = phase(progress, "exact runs", len(units) * len(runs_edits), f"{scope} × edit")
    for unit in units:
        for edit in runs_edits:
            runs.append(run_unit(scorer, hf, originals, unit, edit, scope, base, rotary))
            tick(len(runs), status=str(edit))
    healing = None
    if opts:
        exact = {(r.edit, r.layer, r.head): r.dloss for r in runs}
        ses = [r.dloss_se for r in runs if r.dloss_se]
        healing = heal_runs(hf, scorer, source, tokens, window, units, runs_edits, scope, rotary, exact, base, opts,
                            threshold=min(ses) if ses else None, progress=progress, names=names)
    return ExperimentResult(
        model=info, measure=hf.kind, text=source.name, tokens=scorer.tokens, scored=scorer.counted,
        windows=int(ids.shape[0]), window=int(ids.shape[1]), baseline=base, runs=tuple(_with_ratios(runs)),
        rotary=rotary, baseline_seconds=t_base, seconds=sum(r.seconds for r in runs),
        predictors=_predictors(runs_edits, originals), healing=healing)


def _predictors(edits: list[Edit], originals: dict) -> dict[str, str]:
    from qkinspect.experiment.edits.apply import PREDICTORS
    from qkinspect.experiment.edits.qknorm import predictor

    return {str(e): predictor(PREDICTORS[e.name], e, originals.values()) for e in edits}


def open_experiment(model, revision, layers, heads, tokenizer, device: str | None = None, edits: Sequence[Edit] = (),
                    names: Names = LIBRARY_NAMES, scope: str | None = None, window: int | None = None):
    """The model's identity, its chosen layers in the canonical layout (qkinspect's loader), and the transformers
    model (the same files, through transformers' own classes). The selection and `edits` (on the heads `scope`
    edits together) are checked against the model's description (`requests.check_model`), and transformers' config
    (read from the staged checkpoint, `runtime.staged_config`: its values, and the `window` against its positions)
    before any weight is read."""
    from qkinspect.errors import UnsupportedModelError
    from qkinspect.experiment.model.in_memory import hf_in_memory
    from qkinspect.experiment.model.runtime import load_hf, staged_config
    from qkinspect.loading import open_model

    with open_model(model, revision=revision) as m, contextlib.ExitStack() as stack:
        info = m.info
        check_model(info, edits, layers, heads, names, scope)
        staged = None if info.format == "memory" else stack.enter_context(staged_config(m.resolved))
        if staged is not None and window is not None:
            check_window(staged[1], window, names)
        spec = info.blocks[0]
        wanted = sorted(set(layers)) if layers is not None else list(range(spec.n_layers))
        from qkinspect.experiment.heal import on_cpu

        originals = {i: on_cpu(m.layer(spec.key, i)) for i in wanted}  # the edits are computed on the CPU
        if staged is None:
            hf = hf_in_memory(m.resolved, tokenizer)
            _check_in_place(hf, device)
        else:
            hf = load_hf(m.resolved, tokenizer, device=device or "cpu", option=names.tokenizer, staged=staged)
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
        from qkinspect.errors import InputError

        raise InputError(f"device={device!r}: this model in memory is on {here}, and it runs where it is "
                         f"(move it first: model.to({device!r}))")


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
