"""`qkinspect.heads`: what each head does (behaviour scores from the model's own attention probabilities) beside
what its weights say (`analyze`'s metrics), and how the two relate (docs/heads.md).

The model runs through the experiment's runtime (transformers' own classes from the checked, staged folder; never
remote code), switched to the eager attention kernel, whose attention modules return their probabilities. A forward
hook on each layer's attention module reduces them to scores as they are made, so one layer's (batch, H, T, T)
probabilities are held at a time, never the whole stack `output_attentions` returns; the language-model head is
not run. Batched, under no_grad, in float32.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from qkinspect.behaviour import SCORES
from qkinspect.errors import InputError, UnsupportedModelError
from qkinspect.heads.relate import relate as relate_pair
from qkinspect.heads.request import LIBRARY_NAMES, HeadsRequest, check_positions, check_request
from qkinspect.heads.results import HeadsRecord, HeadsResult, HeadsSettings, RelationRecord
from qkinspect.heads.scores import positional, repeated, summary
from qkinspect.names import Names
from qkinspect.selection import check_selection

Progress = Callable[[int, int], None]
# The module of each layer whose forward returns (output, attention probabilities) under the eager kernel.
ATTENTION = {"llama": "self_attn", "phi3": "self_attn", "gpt2": "attn", "gpt_neox": "attention", "bert": "attention"}


def heads(
    model=None,
    *,
    text: str | Path | None = None,
    windows: int = 16,
    window: int = 128,
    sequences: int = 64,
    length: int = 64,
    seed: int = 0,
    batch: int = 16,
    metrics: str | Iterable[str] | None = None,
    relate: str | Iterable[str] | None = ("symmetry", "overlap_qk", "qk_effective_rank"),
    fold_ln: bool = False,
    fold_qk_norm: bool = False,
    tokenizer: Any = None,
    resamples: int = 1000,
    permutations: int = 1000,
    device: str = "cpu",
    progress: Progress | None = None,
    revision: str | None = None,
    names: Names = LIBRARY_NAMES,
    threads: int | None = None,
    layer_relations: bool = True,
    layers: str | int | Iterable[int] | None = None,
    heads: str | int | Iterable[int] | None = None,
) -> HeadsResult:
    """Behaviour scores of every head, joined with its weight metrics, and their rank correlations.

    Args:
        model: a path, hub id or GGUF file; None for the demo model; or a transformers model in memory (run where
            it is; its attention kernel is switched to eager for the run and switched back).
        text: a text file for the positional scores (previous-token, self, first-token, entropy); None: the topic
            pages of Python's own help (`pydoc_data.topics`).
        windows, window: how many windows of how many tokens (BOS or [CLS] … [SEP] included) of the text.
        sequences, length, seed: the repeated random sequences for induction and duplicate-token: `sequences` of
            `length` distinct random tokens, repeated once (after BOS or [CLS] where the model's inputs start so).
        batch: sequences per forward pass.
        metrics: the weight metrics to join (analyze's names and groups); None: analyze's defaults.
        relate: the weight metrics whose rank correlations with each score are computed.
        fold_ln, fold_qk_norm: measure the weight metrics with the input norms, or the q/k-norm gains (Qwen3,
            OLMo2, Gemma 3), folded in (as `analyze` folds them).
        tokenizer: a tokenizer, or a folder / vocab.txt; None reads the model's own.
        resamples, permutations: for each correlation's bootstrap interval and permutation p-value (0: none).
        device: "cpu", "cuda" or "cuda:N".
        progress: called as progress(done, total) after each forward pass.
        revision: hub revision when `model` is a hub id.
        names: how errors name the options (the CLI passes its own).
        threads: torch threads (None: the cores this process may use); the atlas passes its task's share.
        layer_relations: also relate within each layer (the atlas keeps only all heads and within layers).
        layers, heads: the heads to score, as analyze selects them ("0-3,7", 3, [0, 1]; None: all): hooks only on
            the selected layers (the forward pass stops after the last), each score and weight metric only for the
            selected heads, the relations over them.

    Returns:
        HeadsResult: one record per head (scores, their standard errors, weight metrics), the relations.

    Raises:
        InputError: bad amounts, a selection the model does not have, a model transformers cannot run here or
            whose attention cannot be returned, a `length` or `window` beyond its positions, a text too short for
            one window.

    Example:
        >>> r = qkinspect.heads("path/to/llama", sequences=16, length=32)  # doctest: +SKIP
        >>> r.top("induction", 3)  # doctest: +SKIP
    """
    request = check_request(text=text, windows=windows, window=window, sequences=sequences, length=length,
                            seed=seed, batch=batch, metrics=metrics, relate=relate, fold_ln=fold_ln,
                            fold_qk_norm=fold_qk_norm,
                            resamples=resamples, permutations=permutations, device=device, names=names,
                            layers=layers, heads=heads)
    from qkinspect.experiment.model.scoring import default_text, read_text

    source = default_text() if request.text is None else read_text(
        request.text, request.windows * request.window, what=names.text)
    from qkinspect.analysis.engine import torch_threads
    from qkinspect.analysis.run import analyze
    from qkinspect.loading import open_model
    from qkinspect.selection import check_fold_qk_norm

    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    with open_model(model, revision=revision) as m, contextlib.ExitStack() as stack:
        info = m.info
        if len(info.blocks) != 1:
            raise UnsupportedModelError(f"{info.source}: heads runs models with one attention block; this one has "
                                        f"{', '.join(b.key for b in info.blocks)}")
        flag = names.fold_qk_norm if names.fold_qk_norm.startswith("--") else f"{names.fold_qk_norm}=True"
        check_fold_qk_norm(info.blocks, request.fold_qk_norm, flag)  # before the tokenizer, as the other commands
        check_selection(info, None, request.layers, request.heads, options=(names.blocks, names.layers, names.heads))
        family = _family(m.resolved.config.model_type, info.source)
        causal = family != "bert"
        hf, staged, config, tok = _prepared(m, stack, tokenizer, names)
        prefix, suffix = _specials(tok, causal)
        check_positions(request, config, prefix, suffix)
        text_ids = _windows(tok, source, request, prefix, suffix, causal)
        random_ids = _repeated(tok, config, request, prefix, suffix, causal)
        with torch_threads(threads):
            t1 = time.perf_counter()
            weights = analyze(m, metrics=request.metrics, fold_ln=request.fold_ln,
                              fold_qk_norm=request.fold_qk_norm, spectra=None, layers=request.layers,
                              heads=request.heads)
            seconds["weights"] = time.perf_counter() - t1
        if hf is None:
            from qkinspect.experiment.model.runtime import load_hf

            # only the base model runs: a checkpoint without its language-model head is complete for heads
            hf = load_hf(m.resolved, tok, device=request.device, option=names.tokenizer, staged=staged, head=False)
        seconds["load"] = time.perf_counter() - t0 - seconds["weights"]
    spec = info.blocks[0]
    if len(hf.layers) != spec.n_layers:
        raise UnsupportedModelError(f"{info.source}: transformers built {len(hf.layers)} layers, "
                                    f"the checkpoint has {spec.n_layers}")
    t2 = time.perf_counter()
    total = _passes(len(text_ids), request.batch) + _passes(len(random_ids), request.batch)
    tick = _Ticks(progress, total)
    with torch_threads(threads), _eager(hf.model, info.source):
        chosen = dict(layers=request.layers, heads=request.heads)
        per_text = measure(hf, family, text_ids, request.batch, causal, None, tick, **chosen)
        per_random = measure(hf, family, random_ids, request.batch, causal, (prefix, request.length), tick, **chosen)
    seconds["behaviour"] = time.perf_counter() - t2
    settings = HeadsSettings(source.name, int(text_ids.shape[0]), int(text_ids.shape[1]), request.sequences,
                             request.length, request.seed, causal, prefix, suffix, request.fold_ln,
                             request.fold_qk_norm, tuple(m for m in weights.metric_names if m in _head_metrics()),
                             request.relate, request.resamples, request.permutations, request.device,
                             request.layers, request.heads)
    records = _records(weights, {**per_text, **per_random}, spec, settings.metrics, request.layers, request.heads)
    warnings = list(weights.warnings)
    if text_ids.shape[0] < request.windows:
        warnings.append(f"{source.name}: {text_ids.shape[0]} windows of {text_ids.shape[1]} tokens, fewer than the "
                        f"{request.windows} asked for ({names.windows})")
    t3 = time.perf_counter()
    relate = request.relate
    if relate and (few := too_few_for_rho(records)):
        warnings.append(f"{few} ({names.layers}, {names.heads}): no relations")
        relate = ()
    elif relate and request.heads is not None and len(request.heads) == 1:
        warnings.append(f"one head selected in each layer ({names.heads}): ρ over all heads only, none within layers")
    relations = relations_of(records, relate, seed=request.seed, resamples=request.resamples,
                             permutations=request.permutations, layers=layer_relations)
    seconds["relate"] = time.perf_counter() - t3
    from dataclasses import asdict

    return HeadsResult(info, settings, records, relations, warnings, seconds, asdict(weights.processing))


MIN_HEADS = 3  # the fewest heads a rank correlation is defined over (relate's own floor)


def too_few_for_rho(records: list[HeadsRecord]) -> str | None:
    """Why the selected heads are too few for any ρ, or None: fewer than MIN_HEADS heads over all."""
    if len(records) < MIN_HEADS:
        return f"{len(records)} head{'s' if len(records) != 1 else ''} selected, fewer than the {MIN_HEADS} a rank " \
               "correlation needs"
    return None


def _head_metrics() -> tuple[str, ...]:
    from qkinspect.metrics.registry import HEAD_METRIC_NAMES

    return HEAD_METRIC_NAMES


# -- the model -----------------------------------------------------------------------------------------------------

def _family(model_type: str, source: Any) -> str:
    from qkinspect.experiment.model.runtime import FAMILIES

    if model_type not in FAMILIES or FAMILIES[model_type] not in ATTENTION:
        raise UnsupportedModelError(
            f"{source}: model_type {model_type!r}: heads runs the model with transformers' own classes and reads "
            f"the probabilities their eager attention returns, which is wired for {', '.join(sorted(FAMILIES))} "
            "only")
    return FAMILIES[model_type]


def _prepared(m, stack: contextlib.ExitStack, tokenizer: Any, names: Names):
    """(the model if it is in memory, else None; the staged checkpoint; transformers' config; the tokenizer): the
    config and the tokenizer before any weight is read, so that positions and windows are refused first."""
    from qkinspect.experiment.model.runtime import load_tokenizer, staged_config

    if m.info.format == "memory":
        from qkinspect.experiment.model.in_memory import hf_in_memory

        hf = hf_in_memory(m.resolved, tokenizer)
        return hf, None, hf.model.config, hf.tokenizer
    staged = stack.enter_context(staged_config(m.resolved))
    tok, _ = load_tokenizer(tokenizer, staged[0], names.tokenizer)
    return None, staged, staged[1], tok


@contextlib.contextmanager
def _eager(model, source: Any) -> Iterator[None]:
    """The model switched to transformers' eager attention (whose modules return their probabilities), switched
    back afterwards (a model in memory is the caller's)."""
    before = getattr(model.config, "_attn_implementation", None)
    try:
        model.set_attn_implementation("eager")
    except (ValueError, NotImplementedError, AttributeError) as e:
        raise UnsupportedModelError(f"{source}: transformers has no eager attention for this model, so it cannot "
                                    f"return its attention probabilities ({type(e).__name__})") from None
    try:
        yield
    finally:
        if before and before != "eager":
            with contextlib.suppress(ValueError, NotImplementedError, ImportError):
                model.set_attn_implementation(before)


def _specials(tok, causal: bool) -> tuple[int, int]:
    """How many special tokens open and close each sequence: BOS for a causal model whose tokenizer starts texts
    with it (as it was trained); [CLS] … [SEP] for an encoder whose tokenizer has them."""
    if causal:
        bos = tok.bos_token_id
        return int(bos is not None and tok("a", add_special_tokens=True)["input_ids"][:1] == [bos]), 0
    wrap = tok.cls_token_id is not None and tok.sep_token_id is not None
    return (1, 1) if wrap else (0, 0)


def _wrap(tok, rows: torch.Tensor, prefix: int, suffix: int, causal: bool) -> torch.Tensor:
    n = rows.shape[0]
    first = tok.bos_token_id if causal else tok.cls_token_id
    parts = ([torch.full((n, 1), first, dtype=torch.long)] if prefix else []) + [rows]
    if suffix:
        parts.append(torch.full((n, 1), tok.sep_token_id, dtype=torch.long))
    return torch.cat(parts, dim=1)


def _windows(tok, source, request: HeadsRequest, prefix: int, suffix: int, causal: bool) -> torch.Tensor:
    """The text's first `windows` windows of `window` tokens (special tokens included), (n, window).

    Raises:
        InputError: naming the text option, when the text gives fewer tokens than one window.
    """
    names = request.names
    body = request.window - prefix - suffix
    if body < 2:
        raise InputError(f"{names.said('window', request.window)}: too short for the special tokens around each "
                         "window and two text tokens")
    want = body * request.windows
    chars, ids = want * 16, []
    while True:
        ids = tok(source.text[:chars], add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) > want or chars >= len(source.text):
            break
        chars *= 4
    n = min(request.windows, len(ids) // body)
    if n < 1:
        shown = names.text if request.text is not None else "the built-in text"
        raise InputError(f"{shown} {source.name}: {len(ids)} tokens, fewer than one window of {body} "
                         f"({names.said('window', request.window)})")
    rows = torch.tensor(ids[: n * body], dtype=torch.long).view(n, body)
    return _wrap(tok, rows, prefix, suffix, causal)


def _repeated(tok, config, request: HeadsRequest, prefix: int, suffix: int, causal: bool) -> torch.Tensor:
    """`sequences` rows of `length` distinct random tokens (no special token, within the vocabulary of both the
    tokenizer and the model), each repeated once, from a generator seeded with `seed`: (N, prefix + 2 length +
    suffix)."""
    names = request.names
    vocab = min(len(tok), int(getattr(config, "vocab_size", None) or len(tok)))
    special = set(tok.all_special_ids)
    pool = torch.tensor([i for i in range(vocab) if i not in special], dtype=torch.long)
    if len(pool) < request.length:
        raise InputError(f"{names.said('length', request.length)}: more than the {len(pool)} distinct ordinary "
                         "tokens of this vocabulary")
    g = torch.Generator().manual_seed(request.seed)
    rows = torch.stack([pool[torch.randperm(len(pool), generator=g)[: request.length]]
                        for _ in range(request.sequences)])
    return _wrap(tok, torch.cat([rows, rows], dim=1), prefix, suffix, causal)


# -- the measurement -----------------------------------------------------------------------------------------------

def _passes(n: int, batch: int) -> int:
    return -(-n // batch)


class _Ticks:
    def __init__(self, progress: Progress | None, total: int):
        self.progress, self.total, self.done = progress, total, 0
        if progress is not None:
            progress(0, total)

    def __call__(self) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total)


def attention_modules(hf, family: str) -> list[torch.nn.Module]:
    """Each layer's module whose forward returns (output, attention probabilities) under the eager kernel."""
    return [getattr(layer, ATTENTION[family]) for layer in hf.layers]


class _Enough(Exception):
    """Raised by the last selected layer's hook: the layers after it are not run."""


def measure(hf, family: str, ids: torch.Tensor, batch: int, causal: bool, repeat: tuple[int, int] | None,
            tick: Callable[[], None] = lambda: None, *, layers: Iterable[int] | None = None,
            heads: Iterable[int] | None = None) -> dict[str, np.ndarray]:
    """The scores of every (sequence, layer, head) of `ids`: positional scores, or with `repeat` = (prefix, n)
    the repeated-sequence scores; {score: (N, L, H) float64} (induction absent for an encoder).

    A forward hook on each layer's attention module reduces its probabilities as they are made; the model's base
    runs without its language-model head. `layers`, `heads` (sorted indexes; None: all): hooks only on those
    layers, their probabilities cut to those query heads before they are reduced, and the forward pass stopped
    after the last of them; L and H are then the selection's (in its order)."""
    mods = attention_modules(hf, family)
    chosen = list(range(len(mods))) if layers is None else list(layers)
    pick = None if heads is None else torch.tensor(list(heads), dtype=torch.long)
    stop = chosen[-1] if chosen[-1] < len(mods) - 1 else None  # the last layer run, when layers after it are not
    found: dict[str, list[list[torch.Tensor]]] = {}
    seen = [0] * len(chosen)

    def hook(i: int, at: int):  # layer i, the selection's at-th
        def keep(module, args, output):
            A = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if A is None or A.dim() != 4:
                raise UnsupportedModelError(f"layer {i}: the attention module returned no probabilities under "
                                            "the eager kernel")
            if pick is not None:
                A = A[:, pick.to(A.device)]  # (B, selected heads, T, T)
            got = positional(A, causal=causal) if repeat is None else repeated(
                A, prefix=repeat[0], n=repeat[1], causal=causal)
            for name, v in got.items():
                if v is not None:
                    found.setdefault(name, [[] for _ in chosen])[at].append(v.cpu())
            seen[at] += 1
            if i == stop:
                raise _Enough
        return keep

    handles = [mods[i].register_forward_hook(hook(i, at)) for at, i in enumerate(chosen)]
    device = next(hf.model.parameters()).device
    base = hf.model.base_model
    try:
        with torch.no_grad():
            for start in range(0, len(ids), batch):
                chunk = ids[start:start + batch].to(device)
                with contextlib.suppress(_Enough):
                    base(input_ids=chunk)  # every row is whole (no padding): the model's own default mask
                tick()
    finally:
        for h in handles:
            h.remove()
    if any(s == 0 for s in seen):
        raise UnsupportedModelError("the attention modules of some layers were not run")
    # {score: (N, L, H)}: each layer's batches concatenated over sequences, the layers stacked
    return {name: torch.stack([torch.cat(parts) for parts in layers], dim=1).numpy()
            for name, layers in found.items()}


def _records(weights, per: dict[str, np.ndarray], spec, metrics: tuple[str, ...],
             layers: Iterable[int] | None = None, heads: Iterable[int] | None = None) -> list[HeadsRecord]:
    """A record per selected head (`layers`, `heads`; None: all), from `measure`'s scores over that selection."""
    by_head = {(r.layer, r.head): r for r in weights.heads if r.block == spec.key}
    stats = {name: summary(torch.from_numpy(v)) for name, v in per.items()}
    rep = spec.n_heads // spec.n_kv_heads
    out = []
    for li, layer in enumerate(range(spec.n_layers) if layers is None else layers):
        for hi, head in enumerate(range(spec.n_heads) if heads is None else heads):
            scores, errors = {}, {}
            for s in SCORES:
                mean, se = stats.get(s, (None, None))
                scores[s] = None if mean is None else _num(mean[li, hi])
                errors[s] = None if se is None else _num(se[li, hi])
            rec = by_head.get((layer, head))
            values = {} if rec is None else rec.values
            out.append(HeadsRecord(spec.key, layer, head, head // rep if rec is None else rec.kv_head, scores,
                                   errors, {m: _num(values.get(m)) for m in metrics}))
    return out


def _num(v: Any) -> float | None:
    if v is None:
        return None
    f = float(v)
    return f if np.isfinite(f) else None


def relations_of(records: list[HeadsRecord], metrics: Iterable[str], *, seed: int = 0, resamples: int = 1000,
                 permutations: int = 1000, layers: bool = True) -> list[RelationRecord]:
    """Spearman's ρ of each weight metric with each score: over all heads, within layers pooled, in each layer
    (unless `layers` is False)."""
    out = []
    each = sorted({r.layer for r in records}) if layers else []
    present = [s for s in SCORES if any(r.scores.get(s) is not None for r in records)]
    for metric in metrics:
        x = np.array([_nan(r.weights.get(metric)) for r in records])
        for score in present:
            y = np.array([_nan(r.scores.get(score)) for r in records])
            lay = np.array([r.layer for r in records])
            kw = dict(resamples=resamples, permutations=permutations, seed=seed)
            for scope, groups in (("all", None), ("within", lay)):
                rel = relate_pair(x, y, groups, **kw)
                out.append(RelationRecord(metric, score, scope, None, rel.rho, rel.low, rel.high, rel.p, rel.n))
            for layer in each:
                sel = lay == layer
                rel = relate_pair(x[sel], y[sel], **kw)
                out.append(RelationRecord(metric, score, "layer", layer, rel.rho, rel.low, rel.high, rel.p, rel.n))
    return out


def _nan(v: float | None) -> float:
    return float("nan") if v is None else float(v)
