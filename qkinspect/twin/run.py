"""`qkinspect.twin`: the same small transformer trained from scratch from the same seeds on the same text, as
standard and under each constraint (docs/twin.md).

The request is checked first (qkinspect.twin.request), then the text is read, split and tokenized once here and its
token streams written into the folder; each (variant, seed, lr) run is one task on the sweep engine (Dask
distributed: a local cluster, or `scheduler`), one torch thread each by default, and each run's file is written as
it arrives. With several learning rates the runs go in two phases: seed 0 at every rate, then each variant's best
rate (lowest final held-out loss on seed 0) for the other seeds. A run whose file is in the folder is not run again
(the same `out` resumes); a run that raises is recorded as a failure and the others go on. What the folder holds
is read back, checked, by `qkinspect.twin.saved.read_twin`: the result is the same whether the runs were computed
now or before.

The folder's layout and every file of it read or written: qkinspect.twin.folder.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qkinspect.errors import InputError
from qkinspect.names import Names
from qkinspect.twin.folder import (
    FOLDER_KIND,
    MANIFEST,
    RUN_KIND,
    RUNS,
    check_out,
    existing,
    own_dir,
    run_name,
    run_path,
    write_json,
    write_tokens,
)
from qkinspect.twin.request import LIBRARY_NAMES, TwinRequest, check_request
from qkinspect.twin.results import TwinResult
from qkinspect.twin.saved import done

if TYPE_CHECKING:
    from qkinspect.twin.ladder import LadderResult


def twin(out: str | Path, *, variants: str | Sequence[str] = "standard,share_qk", match_params: bool = False,
         arch: str = "llama", layers: int = 4, d_model: int = 128, heads: int | None = None, context: int = 64,
         config: str | Path | None = None, text: str | Path | None = None, tokenizer: str = "char", seeds: int = 3,
         lr: float | str | Sequence[float] = 1e-3, steps: int | None = None, warmup: int | None = None,
         batch: int = 12, eval_every: int | None = None, eval_windows: int = 128, track_every: int | None = None,
         margin: float = 0.02, device: str = "cpu", save_checkpoints: bool = False, scheduler: str | None = None,
         workers: int | None = None, threads: int | None = None, init: str = "draw", schedule: str = "cosine",
         shapes: str | Sequence[str] | None = None, head_size: int | None = None,
         tokens_per_param: float | None = None, stack: int | None = None, precision: str = "float32",
         compile: bool = False, progress: Any = None, notice: Callable[[str], None] | None = None,
         names: Names = LIBRARY_NAMES) -> TwinResult | LadderResult:
    """Train the twins into the folder `out` (resumable) and return every run's records there.

    Args:
        out: the twin folder (created; the same folder again skips the runs done; a folder holding anything else
            is refused).
        variants: standard, share_qk, share_qk_reformer, symmetric, share_qkv, share_kv, rank:K, wq_identity,
            bilinear (standard is always trained; "standard" alone trains the reference only). `match_params`:
            add each constrained variant's arm with its MLP resized to the standard twin's free parameters (within
            1 %).
        arch, layers, d_model, heads, context: the model (transformers' llama or gpt2 class), or `config`, a
            config.json (llama or gpt2) whose sizes are taken (its vocabulary is the tokenizer's). `heads`
            defaults to 4, or to d_model / `head_size` where a head size or `shapes` is given.
        shapes: a ladder, "2x64,4x128,6x192" (layers x d_model; the head size kept, `head_size` default 32, or
            `heads` for every shape): one folder for every shape's twin (qkinspect.twin.ladder), and a
            `LadderResult` returned. One shape is today's twin (its folder and records).
        tokens_per_param: set each shape's steps so that its training tokens are about this many times its
            non-embedding parameters (instead of `steps`, default 2000, which applies to every shape).
        text: a UTF-8 file or a folder of .txt files (None: Python's pydoc_data.topics, a demo);
            `tokenizer`: char, byte or bpe:N.
        seeds: seeds 0..N-1; each fixes the initialisation and the batch order of every variant.
        lr: one learning rate, or several (a list or "3e-4,1e-3"): each variant's best on seed 0 is used.
        steps, warmup (default min(100, steps/10)), batch: AdamW, linear warm-up, then `schedule`: cosine to
            lr/10, or constant (the rate held after the warm-up).
        init: a constrained twin's start: draw (the standard draw itself put in the form where the form allows:
            share_qk's W_K := W_Q) or nearest (the nearest constrained form to the standard draw), docs/twin.md.
        eval_every (default: at the end only), eval_windows: held-out loss on this many fixed windows.
        track_every: each head's metrics every N steps (qkinspect.callback.Tracker).
        margin: the two one-sided tests' margin in nats.
        device: cpu or cuda. save_checkpoints: each twin's final weights as a transformers folder.
        scheduler: a Dask scheduler address (None: a local cluster of `workers` processes; 0 workers: in this
            process, one run after another). threads: torch threads a task (default: one per core this
            process may use where the CPU's stacks train here by default; otherwise 1).
        stack: the runs of one shape trained together as one batched model (docs/twin.md, "Stacked
            training"): at most this many a task (None: as many as fit in memory; 1: one run a task).
        precision: float32, or bf16 (bfloat16 autocast, float32 weights; a CPU or GPU with bfloat16).
        compile: torch.compile the stacked model (where torch can).
        progress: a receiver of qkinspect.progress (`progress(done, total)`, or an object with `phase` too, such
            as `qkinspect.progress.Lines()`, which prints a line on stderr per run): told each phase of runs
            and ticked as each run finishes or fails, its line (what the CLI prints) as the status.
        notice: called with each line the CLI prints (a run started, finished or failed; runs found done).
        names: how errors name the options (the CLI passes `request.CLI_NAMES`).

    Returns:
        TwinResult: the records of every run in the folder for this request (a `LadderResult` for several shapes).

    Raises:
        InputError: a bad option, unreadable text, a folder holding anything but twins of this setup.

    Example:
        >>> from qkinspect.progress import Lines
        >>> result = twin("twin-out", variants="share_qk", seeds=2, steps=200, progress=Lines())  # doctest: +SKIP
        >>> result.to_pandas("summary")[["variant", "diff", "verdict"]]  # doctest: +SKIP
    """
    from qkinspect.twin.ladder import budget, resolve, run_ladder
    from qkinspect.twin.request import check_types

    check_types(names, out=out, text=text, config=config, progress=progress, notice=notice)

    rungs = resolve(shapes=shapes, layers=layers, d_model=d_model, heads=heads, head_size=head_size, steps=steps,
                    tokens_per_param=tokens_per_param, config=config, names=names)
    if len(rungs) > 1 or tokens_per_param is not None:  # sizes checked before the parameters are counted
        for r in rungs:
            check_request(out, variants=variants, match_params=match_params, arch=arch, layers=r.layers,
                          d_model=r.d_model, heads=r.heads, context=context, config=config, text=text,
                          tokenizer=tokenizer, seeds=seeds, lr=lr, steps=r.steps, batch=batch, margin=margin,
                          eval_windows=eval_windows, device=device, init=init, schedule=schedule, names=names)
        rungs = budget(rungs, tokens_per_param, arch=arch, context=context, batch=batch, config=config, names=names)
    if len(rungs) > 1:
        return run_ladder(Path(out), rungs, tokens_per_param, dict(
            variants=variants, match_params=match_params, arch=arch, context=context, config=config, text=text,
            tokenizer=tokenizer, seeds=seeds, lr=lr, warmup=warmup, batch=batch, eval_every=eval_every,
            eval_windows=eval_windows, track_every=track_every, margin=margin, device=device,
            save_checkpoints=save_checkpoints, scheduler=scheduler, workers=workers, threads=threads, init=init,
            schedule=schedule, stack=stack, precision=precision, compile=compile), progress, names, twin, notice)
    layers, d_model, heads, steps = rungs[0].layers, rungs[0].d_model, rungs[0].heads, rungs[0].steps
    req = check_request(out, variants=variants, match_params=match_params, arch=arch, layers=layers,
                        d_model=d_model, heads=heads, context=context, config=config, text=text, tokenizer=tokenizer,
                        seeds=seeds, lr=lr, steps=steps, warmup=warmup, batch=batch, eval_every=eval_every,
                        eval_windows=eval_windows, track_every=track_every, margin=margin, device=device,
                        save_checkpoints=save_checkpoints, scheduler=scheduler, workers=workers, threads=threads,
                        init=init, schedule=schedule, stack=stack, precision=precision, compile=compile,
                        names=names)
    check_out(req.out, names)
    if req.shape.config is not None:  # a config.json it cannot use is refused before the text is read
        from qkinspect.twin.model import config_for
        from qkinspect.twin.request import check_rank_pairs

        check_rank_pairs(req.variants, config_for(req.shape, 2, names=names).model_type, names)
    if req.device == "cuda":
        from qkinspect.device import check_device

        check_device("cuda", names.device)
    if req.precision != "float32" or req.compile:  # refused here, before the text is read
        from qkinspect.twin.stacked import check_compile, check_precision

        check_precision(req.precision, req.device, names.said("precision", req.precision))
        if req.compile:
            check_compile(req.device, names.compile)
    spec, manifest = prepare(req, names)
    failures: list[dict[str, Any]] = []
    say = notice or (lambda line: None)
    key = manifest["key"]
    first = [(v, 0, x) for v in req.variants for x in req.lrs] if len(req.lrs) > 1 else \
        [(v, s, req.lrs[0]) for v in req.variants for s in range(req.seeds)]
    sweeping = len(req.lrs) > 1
    execute(req, spec, key, first, failures, say, progress, "lr sweep on seed 0" if sweeping else "twins", names)
    if sweeping and req.seeds > 1:
        best = chosen_lrs(req.out, req.variants, req.lrs, key)
        second = [(v, s, best[v]) for v in req.variants if v in best for s in range(1, req.seeds)]
        execute(req, spec, key, second, failures, say, progress, "the other seeds at the chosen rates", names)
    manifest["failures"] = failures
    write_json(req.out / MANIFEST, manifest)
    from qkinspect.twin.saved import read_twin

    return read_twin(req.out)


def prepare(req: TwinRequest, names: Names) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read and tokenize the text, write the token streams and the manifest (refusing a folder of another setup);
    returns the runs' spec and the manifest."""
    from qkinspect.twin.data import Tokenizer, check_lengths, eval_starts, read_corpus, tokenize
    from qkinspect.twin.model import config_for

    corpus = read_corpus(req.text, names)
    tok = Tokenizer(req.tokenizer, [p.train for p in corpus.parts])
    tokens = tokenize(corpus, tok)
    check_lengths(tokens, req.shape.context, names)
    cfg = config_for(req.shape, tokens.vocab_size, names=names)
    limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
    if limit is not None and limit < req.shape.context:
        raise InputError(f"{names.said('context', req.shape.context)}: the config takes at most {limit} positions")
    starts = eval_starts(len(tokens.held_out), req.shape.context, req.eval_windows)
    training = req.training()
    key = hashlib.sha256(json.dumps([training, corpus.sha256, tok.sha256], sort_keys=True).encode()).hexdigest()[:16]
    manifest = existing(req.out, key, training, corpus.sha256, tok.sha256, names)
    setup = {
        "text": {"name": corpus.name, "sha256": corpus.sha256, "chars": corpus.chars, "demo": corpus.demo,
                 "files": [p.name for p in corpus.parts], "train_tokens": int(len(tokens.train)),
                 "held_out_tokens": int(len(tokens.held_out)),
                 "held_out_bytes": sum(len(p.held_out.encode("utf-8")) for p in corpus.parts),
                 "held_out": "the last 10 % of each file (contiguous); training windows come from the rest"},
        "tokenizer": {"kind": tok.kind, "vocab_size": tok.vocab_size, "sha256": tok.sha256},
        "model": {"arch": cfg.model_type, "config": cfg.to_dict()},
        "training": {"steps": req.steps, "warmup": req.warmup, "batch": req.batch, "context": req.shape.context,
                     "optimizer": "AdamW (no weight decay), linear warm-up, " + (
                         "cosine to lr/10" if req.schedule == "cosine" else "then constant"),
                     "schedule": req.schedule, "init": req.init, "device": req.device, "threads": task_threads(req)},
        "evaluation": {"windows": int(len(starts)), "tokens": int(len(starts)) * req.shape.context,
                       "every": req.eval_every,
                       "what": "evenly spaced, non-overlapping windows of the held-out text, the same for every run"},
    }
    manifest.update({"schema": "qkinspect/1", "kind": FOLDER_KIND, "key": key, "training": training,
                     "setup": setup, "plan": {"variants": list(req.variants), "seeds": req.seeds,
                                              "lrs": list(req.lrs), "margin": req.margin}})
    folder = req.out
    try:
        own_dir(folder)
        write_json(folder / MANIFEST, manifest)  # first: a folder stopped before its tokens is still a twin's
        own_dir(folder / RUNS)
    except OSError as e:
        raise InputError(f"{names.said('out', folder)}: cannot create the twin folder ({e.strerror or e})") from None
    write_tokens(folder, tokens.train, tokens.held_out, tok.serialized())
    spec = {**training, "vocab_size": tokens.vocab_size, "eval_starts": starts.tolist()}
    return spec, manifest


def execute(req: TwinRequest, spec: dict[str, Any], key: str, plan: list[tuple[str, int, float]],
            failures: list[dict[str, Any]], say: Callable[[str], None], progress: Any = None, phase: str = "twins",
            names: Names = LIBRARY_NAMES) -> None:
    """Run the plan's runs not in the folder yet, writing each as it arrives; failures recorded. `progress` (a
    qkinspect.progress receiver) is told the phase `phase` and ticked after each run, its line as the status."""
    from qkinspect.progress import phase as begin
    from qkinspect.terminal.twin import plural

    todo = [(v, s, x) for v, s, x in plan if done(req.out, v, s, x, key) is None]
    if len(todo) < len(plan):
        say(f"{len(plan) - len(todo)} of {plural(len(plan), 'run')} already in {req.out}")
    if not todo:
        return
    tick = begin(progress, phase, len(todo), "runs")
    folder = str(req.out)

    def finished(item, result: dict[str, Any] | None, error: str | None, n: int) -> None:
        v, s, x = item
        if error is not None:
            failures.append({"variant": v, "seed": s, "lr": x, "error": error})
            line = f"[{n}/{len(todo)}] {run_name(v, s, x)} failed: {error}"
        else:
            write_json(run_path(req.out, v, s, x), {"schema": "qkinspect/1", "kind": RUN_KIND, "key": key,
                                                    "run": result})
            line = (f"[{n}/{len(todo)}] {run_name(v, s, x)}: held-out loss {result['points'][-1]['val_loss']:.4f} "
                    f"in {result['seconds']:.0f} s")
        say(line)
        tick(n, status=line)

    stacks = _stacks(req, spec, todo, say)
    if stacks is not None:
        _stacked(req, spec, stacks, folder, finished, say, names)
        return
    if req.workers == 0 and req.scheduler is None:  # in this process, one after another
        from qkinspect.analysis.engine import torch_threads  # torch's threads given back when training here ends

        with torch_threads(task_threads(req)):
            _here(req, spec, todo, folder, finished, say)
        return
    _on_dask(req, spec, todo, folder, finished, say, names)


def _here(req: TwinRequest, spec, todo, folder: str, finished, say) -> None:
    from qkinspect.twin.train import run_twin

    for n, item in enumerate(todo, start=1):
        say(f"[{n}/{len(todo)}] {run_name(*item)} started")
        try:
            result = run_twin(folder, *item, spec, threads=task_threads(req))
        except Exception as e:  # noqa: BLE001 - a failed run is recorded; the others go on
            finished(item, None, " ".join(f"{type(e).__name__}: {e}".split()), n)
            continue
        finished(item, result, None, n)


def _on_dask(req: TwinRequest, spec, todo, folder: str, finished, say, names: Names) -> None:
    import uuid

    from distributed import as_completed

    from qkinspect.sweep.engine import cancelling, error_text
    from qkinspect.terminal.twin import plural
    from qkinspect.twin.cluster import twin_cluster
    from qkinspect.twin.train import run_twin

    with twin_cluster(req.device, req.scheduler, req.workers, req.threads or 1, len(todo), names) as \
            (client, threads, extra):
        futures = {client.submit(run_twin, folder, v, s, x, spec, threads=req.threads or threads, pure=False,
                                 key=f"qkinspect-twin-{run_name(v, s, x)}-{uuid.uuid4().hex[:8]}", **extra): (v, s, x)
                   for v, s, x in todo}
        say(f"{plural(len(todo), 'run')} submitted")
        with cancelling(client, futures):
            for n, fut in enumerate(as_completed(futures), start=1):
                item = futures[fut]
                if fut.status == "finished":
                    finished(item, fut.result(), None, n)
                else:
                    finished(item, None, error_text(fut), n)
                fut.release()


def _stacks(req: TwinRequest, spec: dict[str, Any], todo, say) -> list[list[tuple[str, int, float]]] | None:
    """The runs to do as stacks (qkinspect.twin.stacked), or None where each runs alone (`stack` 1 in float32, or
    a config the batched model does not reproduce)."""
    if req.stack == 1 and req.precision == "float32" and not req.compile:
        return None
    from qkinspect.twin.batched import supported
    from qkinspect.twin.model import config_for
    from qkinspect.twin.stacked import largest_stack, plan_stacks

    why = supported(config_for(req.shape, spec["vocab_size"]))
    if why is not None:
        if req.precision != "float32" or req.compile:
            raise InputError(f"the batched twin does not reproduce this config ({why}): train it in float32 without "
                             "compile")
        say(f"the batched twin does not reproduce this config ({why}): one run a task")
        return None
    largest = largest_stack(spec, spec["vocab_size"])
    if req.stack is None and req.scheduler is None and not _in_process(req):  # shared among the local workers
        from qkinspect import limits

        workers = 1 if req.workers == 0 else req.workers or limits.cores()
        largest = min(largest, -(-len(todo) // workers))
    return plan_stacks(todo, req.stack, largest)


def task_threads(req: TwinRequest) -> int:
    """The torch threads of a task that trains in this process: `threads` where given; by default one per core this
    process may use where the runs train here as stacks (one task holds the machine: on this project's 2 cores the
    stack of 9 took 13.5-16.0 s on two threads against 26.3-30.6 s on one, quiet machine), one for single runs
    (`--stack 1`) and on workers. On a machine other work shares, `--threads 1` (two threads behind other work ran
    5-20x slower): docs/twin.md, "Engine"."""
    if req.threads is not None:
        return req.threads
    if _in_process(req) and req.stack != 1:
        from qkinspect import limits

        return limits.cores()
    return 1


def _in_process(req: TwinRequest) -> bool:
    """Whether the stacks train in this process, one after another: with 0 workers, and by default on the CPU (no
    --workers, --stack or --scheduler: each kind's runs one stack, what fits in memory, on one thread per core; on
    this project's 2 cores one stack of 9 here was 1.5-1.8x faster in wall time than one run a task on a local
    cluster of 2 on a quiet machine: docs/twin.md, "Stacked training")."""
    if req.scheduler is not None:
        return False
    return req.workers == 0 or (req.workers is None and req.stack is None and req.device == "cpu")


def _stacked(req: TwinRequest, spec, stacks, folder: str, finished, say, names: Names) -> None:
    """Each stack one task (in this process with 0 workers or by default on the CPU, else on the sweep engine);
    its runs' files written as it returns (a stack that fails records each of its runs as failed)."""
    from qkinspect.twin.stacked import run_stack

    n = 0
    options = {"precision": req.precision, "compile": req.compile}

    def arrived(items, results, error) -> None:
        nonlocal n
        for k, item in enumerate(items):
            n += 1
            why = error or results[k].get("error")
            finished(item, None if why else results[k], why, n)

    def names_of(items) -> str:
        return ", ".join(run_name(*it) for it in items)

    if _in_process(req) or (req.scheduler is None and len(stacks) == 1):  # a cluster for one task: only its start
        from qkinspect.analysis.engine import torch_threads

        with torch_threads(task_threads(req)):
            for k, items in enumerate(stacks, start=1):
                say(f"stack {k}/{len(stacks)} of {len(items)} runs started: {names_of(items)}")
                try:
                    results = run_stack(folder, items, spec, threads=task_threads(req), **options)
                except Exception as e:  # noqa: BLE001 - a failed stack is recorded; the others go on
                    arrived(items, None, " ".join(f"{type(e).__name__}: {e}".split()))
                    continue
                arrived(items, results, None)
        return
    import uuid

    from distributed import as_completed

    from qkinspect.sweep.engine import cancelling, error_text
    from qkinspect.twin.cluster import twin_cluster

    with twin_cluster(req.device, req.scheduler, req.workers, req.threads or 1, len(stacks), names) as \
            (client, threads, extra):
        futures = {client.submit(run_stack, folder, items, spec, threads=req.threads or threads or 1,
                                 **options, pure=False, key=f"qkinspect-twin-stack-{uuid.uuid4().hex[:12]}",
                                 **extra): items for items in stacks}
        say(f"{sum(len(s) for s in stacks)} runs submitted as {len(stacks)} stacks")
        with cancelling(client, futures):
            for fut in as_completed(futures):
                items = futures[fut]
                if fut.status == "finished":
                    arrived(items, fut.result(), None)
                else:
                    arrived(items, None, error_text(fut))
                fut.release()


def chosen_lrs(folder: Path, variants: Sequence[str], lrs: Sequence[float], key: str) -> dict[str, float]:
    """Each variant's learning rate with the lowest final held-out loss on seed 0 (of the runs that finished)."""
    from qkinspect.twin.summary import best_lr

    best: dict[str, float] = {}
    for v in variants:
        chosen = best_lr({x: doc["run"]["points"][-1]["val_loss"] for x in lrs
                          if (doc := done(folder, v, 0, x, key)) is not None})
        if chosen is not None:
            best[v] = chosen
    return best
