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

Folder:
    twin.json                  the setup (text, tokenizer, model config, training, evaluation windows), the plan
                               (variants, seeds, learning rates, margin), the resume key, the failures
    tokens/train.npy, held_out.npy, tokenizer.txt   the token streams and the tokenizer the runs read
    runs/<variant>-s<seed>-lr<lr>.json               one file per finished run (its curve, trajectory, timing)
    tracks/<run>/              the run's head metrics while it trained (a sweep folder; --track-every)
    checkpoints/<variant>-s<seed>/   config.json + model.safetensors (--save-checkpoints)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qkinspect.errors import InputError
from qkinspect.names import Names
from qkinspect.twin.request import LIBRARY_NAMES, Request, check_request
from qkinspect.twin.results import FOLDER_KIND, MANIFEST, RUN_KIND, RUNS, Twin

if TYPE_CHECKING:
    from qkinspect.twin.ladder import Ladder


def twin(out: str | Path, *, variants: str | Sequence[str] = "standard,share_qk", match_params: bool = False,
         arch: str = "llama", layers: int = 4, d_model: int = 128, heads: int | None = None, context: int = 64,
         config: str | Path | None = None, text: str | Path | None = None, tokenizer: str = "char", seeds: int = 3,
         lr: float | str | Sequence[float] = 1e-3, steps: int | None = None, warmup: int | None = None,
         batch: int = 12, eval_every: int | None = None, eval_windows: int = 128, track_every: int | None = None,
         margin: float = 0.02, device: str = "cpu", save_checkpoints: bool = False, scheduler: str | None = None,
         workers: int | None = None, threads: int | None = None, init: str = "draw", schedule: str = "cosine",
         shapes: str | Sequence[str] | None = None, head_size: int | None = None,
         tokens_per_param: float | None = None, progress: Callable[[str], None] | None = None,
         names: Names = LIBRARY_NAMES) -> Twin | Ladder:
    """Train the twins into the folder `out` (resumable) and return every run's records there.

    Args:
        out: the twin folder (created; the same folder again skips the runs done).
        variants: standard, share_qk, share_qk_reformer, symmetric, share_qkv, share_kv, rank:K, wq_identity,
            bilinear (standard is always trained). `match_params`: add each constrained variant's arm with its MLP
            resized to the standard twin's free parameters (within 1 %).
        arch, layers, d_model, heads, context: the model (transformers' llama or gpt2 class), or `config`, a
            config.json (llama or gpt2) whose sizes are taken (its vocabulary is the tokenizer's). `heads`
            defaults to 4, or to d_model / `head_size` where a head size or `shapes` is given.
        shapes: a ladder, "2x64,4x128,6x192" (layers x d_model; the head size kept, `head_size` default 32, or
            `heads` for every shape): one folder for every shape's twin (qkinspect.twin.ladder), and a
            `Ladder` returned. One shape is today's twin (its folder and records).
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
            process, one run after another). threads: torch threads per run (default 1).
        progress: called with one line per run started, finished or failed.
        names: how errors name the options (the CLI passes `request.CLI_NAMES`).

    Returns:
        Twin: the records of every run in the folder for this request (a `Ladder` for several shapes).

    Raises:
        InputError: a bad option, unreadable text, a folder holding runs of another setup.

    Example:
        >>> result = twin("twin-out", variants="share_qk", seeds=2, steps=200)  # doctest: +SKIP
        >>> result.to_pandas("summary")[["variant", "diff", "verdict"]]  # doctest: +SKIP
    """
    from qkinspect.twin.ladder import budget, resolve, run_ladder

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
            schedule=schedule), progress, names)
    layers, d_model, heads, steps = rungs[0].layers, rungs[0].d_model, rungs[0].heads, rungs[0].steps
    req = check_request(out, variants=variants, match_params=match_params, arch=arch, layers=layers,
                        d_model=d_model, heads=heads, context=context, config=config, text=text, tokenizer=tokenizer,
                        seeds=seeds, lr=lr, steps=steps, warmup=warmup, batch=batch, eval_every=eval_every,
                        eval_windows=eval_windows, track_every=track_every, margin=margin, device=device,
                        save_checkpoints=save_checkpoints, scheduler=scheduler, workers=workers, threads=threads,
                        init=init, schedule=schedule, names=names)
    if req.shape.config is not None:  # a config.json it cannot use is refused before the text is read
        from qkinspect.twin.model import config_for
        from qkinspect.twin.request import check_rank_pairs

        check_rank_pairs(req.variants, config_for(req.shape, 2, names=names).model_type, names)
    if req.device == "cuda":
        from qkinspect.device import check_device

        check_device("cuda", names.device)
    spec, manifest = prepare(req, names)
    failures: list[dict[str, Any]] = []
    say = progress or (lambda line: None)
    first = [(v, 0, x) for v in req.variants for x in req.lrs] if len(req.lrs) > 1 else \
        [(v, s, req.lrs[0]) for v in req.variants for s in range(req.seeds)]
    execute(req, spec, first, failures, say, names)
    if len(req.lrs) > 1 and req.seeds > 1:
        best = chosen_lrs(req.out, req.variants, req.lrs, manifest["key"])
        second = [(v, s, best[v]) for v in req.variants if v in best for s in range(1, req.seeds)]
        execute(req, spec, second, failures, say, names)
    manifest["failures"] = failures
    _write(req.out / MANIFEST, manifest)
    from qkinspect.twin.saved import read_twin

    return read_twin(req.out)


def prepare(req: Request, names: Names) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read and tokenize the text, write the token streams and the manifest (refusing a folder of another setup);
    returns the runs' spec and the manifest."""
    import numpy as np

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
    manifest = _existing(req.out, key, names)
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
                     "schedule": req.schedule, "init": req.init, "device": req.device, "threads": req.threads},
        "evaluation": {"windows": int(len(starts)), "tokens": int(len(starts)) * req.shape.context,
                       "every": req.eval_every,
                       "what": "evenly spaced, non-overlapping windows of the held-out text, the same for every run"},
    }
    manifest.update({"schema": "qkinspect/1", "kind": FOLDER_KIND, "key": key, "training": training,
                     "setup": setup, "plan": {"variants": list(req.variants), "seeds": req.seeds,
                                              "lrs": list(req.lrs), "margin": req.margin}})
    folder = req.out
    try:
        (folder / "tokens").mkdir(parents=True, exist_ok=True)
        (folder / RUNS).mkdir(exist_ok=True)
    except OSError as e:
        raise InputError(f"{names.said('out', folder)}: cannot create the twin folder ({e.strerror or e})") from None
    np.save(folder / "tokens" / "train.npy", tokens.train.astype(np.int32))
    np.save(folder / "tokens" / "held_out.npy", tokens.held_out.astype(np.int32))
    (folder / "tokens" / "tokenizer.txt").write_text(tok.serialized(), encoding="utf-8")
    _write(folder / MANIFEST, manifest)
    spec = {**training, "vocab_size": tokens.vocab_size, "eval_starts": starts.tolist()}
    return spec, manifest


def _existing(folder: Path, key: str, names: Names) -> dict[str, Any]:
    """The folder's manifest where it was written for this setup (resumed), {} where there is none; InputError
    where it holds runs of another setup."""
    path = folder / MANIFEST
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{names.said('out', folder)}: not a folder")
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: not a twin folder's manifest ({e})") from None
    if not isinstance(doc, dict) or doc.get("kind") != FOLDER_KIND:
        raise InputError(f"{path}: not a twin folder's manifest")
    if doc.get("key") != key:
        raise InputError(f"{names.said('out', folder)}: holds twins of another setup (text, tokenizer, model or "
                         "training options); choose another folder")
    return doc


def run_path(folder: Path, variant: str, seed: int, lr: float) -> Path:
    from qkinspect.twin.train import run_name

    return folder / RUNS / f"{run_name(variant, seed, lr)}.json"


def done(folder: Path, variant: str, seed: int, lr: float, key: str) -> dict[str, Any] | None:
    """A finished run's document, where its file is in the folder for this setup."""
    path = run_path(folder, variant, seed, lr)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    ok = isinstance(doc, dict) and doc.get("key") == key and isinstance(doc.get("run"), dict)
    return doc if ok and (doc["run"].get("variant"), doc["run"].get("seed"), doc["run"].get("lr")) == \
        (variant, seed, lr) else None


def execute(req: Request, spec: dict[str, Any], plan: list[tuple[str, int, float]], failures: list[dict[str, Any]],
            say: Callable[[str], None], names: Names = LIBRARY_NAMES) -> None:
    """Run the plan's runs not in the folder yet, writing each as it arrives; failures recorded."""
    from qkinspect.twin.train import run_name, run_twin

    key = json.loads((req.out / MANIFEST).read_text(encoding="utf-8"))["key"]
    todo = [(v, s, x) for v, s, x in plan if done(req.out, v, s, x, key) is None]
    if len(todo) < len(plan):
        say(f"{len(plan) - len(todo)} of {len(plan)} runs already in {req.out}")
    if not todo:
        return
    folder = str(req.out)

    def finished(item, result: dict[str, Any] | None, error: str | None, n: int) -> None:
        v, s, x = item
        if error is not None:
            failures.append({"variant": v, "seed": s, "lr": x, "error": error})
            say(f"[{n}/{len(todo)}] {run_name(v, s, x)} failed: {error}")
            return
        _write(run_path(req.out, v, s, x), {"schema": "qkinspect/1", "kind": RUN_KIND, "key": key, "run": result})
        say(f"[{n}/{len(todo)}] {run_name(v, s, x)}: held-out loss {result['points'][-1]['val_loss']:.4f} "
            f"in {result['seconds']:.0f} s")

    if req.workers == 0 and req.scheduler is None:  # in this process, one after another
        for n, item in enumerate(todo, start=1):
            say(f"[{n}/{len(todo)}] {run_name(*item)} started")
            try:
                result = run_twin(folder, *item, spec, threads=req.threads)
            except Exception as e:  # noqa: BLE001 - a failed run is recorded; the others go on
                finished(item, None, " ".join(f"{type(e).__name__}: {e}".split()), n)
                continue
            finished(item, result, None, n)
        return
    _on_dask(req, spec, todo, folder, finished, say, names)


def _on_dask(req: Request, spec, todo, folder: str, finished, say, names: Names) -> None:
    import uuid

    from distributed import as_completed

    from qkinspect.sweep.engine import cancelling, error_text
    from qkinspect.twin.cluster import twin_cluster
    from qkinspect.twin.train import run_name, run_twin

    with twin_cluster(req.device, req.scheduler, req.workers, req.threads, len(todo), names) as \
            (client, threads, extra):
        futures = {client.submit(run_twin, folder, v, s, x, spec, threads=req.threads or threads, pure=False,
                                 key=f"qkinspect-twin-{run_name(v, s, x)}-{uuid.uuid4().hex[:8]}", **extra): (v, s, x)
                   for v, s, x in todo}
        say(f"{len(todo)} runs submitted")
        with cancelling(client, futures):
            for n, fut in enumerate(as_completed(futures), start=1):
                item = futures[fut]
                if fut.status == "finished":
                    finished(item, fut.result(), None, n)
                else:
                    finished(item, None, error_text(fut), n)
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


def _write(path: Path, doc: dict[str, Any]) -> None:
    from qkinspect.documents import json_safe
    from qkinspect.sweep.store import write_json

    write_json(path, json_safe(doc))
