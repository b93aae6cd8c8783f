"""Building an atlas: the models analysed on the sweep's engine (Dask, resumable, one model per task), the saved
analyses taken in as they are, the manifest written; the atlas is then read back from the folder.

The engine is the sweep's (`qkinspect.sweep.engine.run`) with shapes allowed to differ and the layer form always
measured: each model is one task (`analyze` on that model, in one worker, one model in memory per worker at a
time), its result written into DIR/models/ as it arrives; a re-run skips the models done; a model that cannot be
opened or analysed is retried once, then recorded as failed while the others finish.

`build_atlas` takes the caller's arguments, checks them once (`qkinspect.atlas.request`), finds the models
(`qkinspect.atlas.inputs`) and builds; `atlas` (the package's call, `qkinspect.atlas(...)`) reads the result back.

Example:
    >>> done = build_atlas(["./bert", "gpt2.gguf", "run.json"], out="atlas/")  # doctest: +SKIP
    >>> atlas = done.read()  # doctest: +SKIP
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qkinspect.atlas.behaviour import join  # light: heads is imported inside, in the task
from qkinspect.atlas.inputs import SavedEntry, entries
from qkinspect.atlas.request import OPTION_NAMES, AtlasRequest, check_request
from qkinspect.atlas.results import AtlasResult
from qkinspect.atlas.saved import read_atlas
from qkinspect.names import Names
from qkinspect.sweep.checkpoints import Checkpoint
from qkinspect.sweep.keys import Failure
from qkinspect.sweep.names import LIBRARY_NAMES


@dataclass
class AtlasOutcome:
    """What an atlas run did: models computed now, skipped (already in the folder), failed; saved analyses taken;
    `entries`: the names of every entry asked for."""

    folder: Path
    computed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    saved: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    entries: list[str] = field(default_factory=list)

    def read(self) -> AtlasResult:
        return read_atlas(self.folder)


def build(request: AtlasRequest, items: list[Checkpoint | SavedEntry], *, progress: Callable | None = None,
          notice: Callable[[str], None] | None = None) -> AtlasOutcome:
    """Build the atlas of `items` (from `entries`) as `request` (from `check_request`) asks.

    Raises:
        InputError: a saved analysis that is not one, an unreachable scheduler, a folder that holds files but is
            not an atlas's (a sweep folder among them): before any work.
        KeyboardInterrupt after cancelling the pending tasks (what is written is kept: run again to resume).
    """
    from dataclasses import replace

    from qkinspect.atlas import folder as store
    from qkinspect.sweep.engine import run
    from qkinspect.sweep.store import check_folder, write_json

    folder, options, names = request.out, request.options, request.names
    models = [e for e in items if isinstance(e, Checkpoint)]
    if request.scheduler is not None and models:
        from qkinspect.sweep.scheduler import check_address, probe

        # a scheduler that is not one is refused before the folder is made (the engine asks again)
        probe(check_address(request.scheduler, names.scheduler), option=names.scheduler)
    check_folder(folder)
    store.check_out(folder, names.out)
    # a saved analysis is checked now (bad input: before any work) and kept as `analyze -o` wrote it
    saved = [(e, _saved_document(e.path)) for e in items if isinstance(e, SavedEntry)]
    try:
        (folder / store.SAVED).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        from qkinspect.errors import OutputError

        raise OutputError(f"{folder}: cannot create the atlas folder ({e.strerror or e})") from None
    files = {}
    for entry, doc in saved:
        text = json.dumps(doc, sort_keys=True, allow_nan=False)
        path = store.saved_path(folder, entry.name, text)
        write_json(path, doc)
        files[entry.name] = str(path.relative_to(folder))
    manifest = [{"name": e.name, "entry": "model" if isinstance(e, Checkpoint) else "saved",
                 "file": None if isinstance(e, Checkpoint) else files[e.name]} for e in items]
    store.write_manifest(folder, options, manifest)  # what an interrupted atlas leaves to read
    outcome = AtlasOutcome(folder, saved=[e.name for e, _ in saved], entries=[e.name for e in items])
    if models:
        # the request is a sweep's (checked whole by check_request), run in the folder's models/
        done = run(replace(request, out=folder / store.MODELS), models, progress=progress, notice=notice,
                   same_shapes=False, extend=join if options.get("behaviour") else None)
        outcome.computed, outcome.skipped = done.computed, done.skipped
        outcome.failures, outcome.refused = done.failures, done.refused
    store.write_manifest(folder, options, manifest, outcome.failures)
    return outcome


def _saved_document(path: Path) -> dict[str, Any]:
    """A saved analysis as `analyze -o` wrote it; a heads document (`qkinspect heads -o`) as the analysis of its
    heads with the behaviour scores beside the weight metrics (`HeadsResult.analysis_document`; the atlas reads it
    back from its folder through the analysis reader, as every saved analysis)."""
    from qkinspect.analysis.saved import read_saved
    from qkinspect.heads.saved import is_heads

    if not is_heads(path):
        return {"kind": "analyze", **read_saved(path).document()}
    from qkinspect.errors import InputError
    from qkinspect.heads.saved import read

    try:
        return read(path).analysis_document()
    except ValueError as e:
        raise InputError(f"{path}: {e}") from None


def run_atlas(items: list[Checkpoint | SavedEntry], options: dict[str, Any], folder: str | Path, *,
              scheduler: str | None = None, workers: int | None = None, threads: int | None = None,
              device: str = "cpu", progress: Callable | None = None,
              notice: Callable[[str], None] | None = None, names: Names = LIBRARY_NAMES) -> AtlasOutcome:
    """Build the atlas of `items` (from `entries`) in `folder`.

    Args:
        options: metrics, precision, fold_ln, fold_qk_norm (checked by `check_request`); the layer form is always
            measured.
        scheduler, workers, threads, device, progress, notice, names: as qkinspect.sweep.run_sweep takes them.

    Raises:
        InputError: a bad option (`check_request`), and what `build` refuses, before any work.
        KeyboardInterrupt after cancelling the pending tasks (what is written is kept: run again to resume).
    """
    from qkinspect.errors import InputError

    given = {k: v for k, v in options.items() if k != "layer_form"}
    unknown = set(given) - set(OPTION_NAMES)
    if unknown:
        raise InputError(f"atlas: unknown options {', '.join(sorted(unknown))}; it takes {', '.join(OPTION_NAMES)}")
    request = check_request(folder, **given, device=device, scheduler=scheduler, workers=workers, threads=threads,
                            names=names)
    return build(request, items, progress=progress, notice=notice)


def build_atlas(models: list[str] | tuple[str, ...] | str = (), *, out: str | Path,
                from_file: str | Path | None = None, hf_cache: bool = False,
                metrics: list[str] | tuple[str, ...] | str | None = None, precision: str = "float32",
                fold_ln: bool = False, fold_qk_norm: bool = False, device: str = "cpu", scheduler: str | None = None,
                workers: int | None = None, threads: int | None = None, progress: Callable | None = None,
                notice: Callable[[str], None] | None = None, behaviour: bool = False, sequences: int | None = None,
                length: int | None = None, seed: int | None = None, names: Names = LIBRARY_NAMES) -> AtlasOutcome:
    """`atlas`'s work without reading the folder back: the request checked (before the models are looked for),
    the models found, the atlas built; what was done (`AtlasOutcome`; its `read()` is the atlas). `names`: how
    errors name the options (the CLI passes its own)."""
    request = check_request(out, metrics=metrics, precision=precision, fold_ln=fold_ln, fold_qk_norm=fold_qk_norm,
                            device=device, scheduler=scheduler, workers=workers, threads=threads, behaviour=behaviour,
                            sequences=sequences, length=length, seed=seed, names=names)
    items = entries([models] if isinstance(models, str) else list(models), from_file=from_file, hf_cache=hf_cache,
                    names=names)
    return build(request, items, progress=progress, notice=notice)


def atlas(models: list[str] | tuple[str, ...] | str = (), *, out: str | Path, from_file: str | Path | None = None,
          hf_cache: bool = False, metrics: list[str] | str | None = None, precision: str = "float32",
          fold_ln: bool = False, fold_qk_norm: bool = False, device: str = "cpu", scheduler: str | None = None,
          workers: int | None = None, threads: int | None = None, progress: Callable | None = None,
          behaviour: bool = False, sequences: int | None = None, length: int | None = None,
          seed: int | None = None) -> AtlasResult:
    """The atlas of many models of any family, shape and format: per model and block, each metric's distribution
    over heads, the layer form, and per layer the median over heads at normalised depth l / (L − 1), with the
    models' facts (docs/atlas.md).

    Args:
        models: folders, weight files, GGUF files, hub ids (the local cache when offline), globs, and saved
            analyses (`qkinspect analyze -o run.json`, taken as they are).
        out: the atlas folder (created; a re-run skips the models done).
        from_file: a file naming one model a line. hf_cache: every model the local Hugging Face cache holds.
        metrics, precision, fold_ln, device: as `qkinspect.analyze` takes them (the layer form is always on).
        fold_qk_norm: fold the q/k-norm gains (Qwen3, OLMo2, Gemma3) of each model that has them, so that its
            form is what attention computes; without it those models are measured raw, and flagged.
        scheduler, workers, threads, progress: as `qkinspect.sweep.run_sweep` takes them (a script that starts
            the local cluster needs an `if __name__ == "__main__":` guard).
        behaviour: also run `qkinspect.heads` in each model's task: its six behaviour scores join the per-head
            metrics (depth records as for a weight metric) and its relations (Spearman's ρ of symmetry, Q/K
            overlap and QK effective rank with each score, interval, p) are in `relations`. sequences, length,
            seed: its repeated random sequences (default 16 of 2 x 32 tokens, seed 0; 8 text windows of 64).

    Returns:
        AtlasResult; the models that failed are in its `failures` (the others are there).

    Example:
        >>> atlas = qkinspect.atlas(["./bert", "SmolLM2-135M.gguf"], out="atlas/")  # doctest: +SKIP
        >>> atlas.to_pandas().query("scope == 'layer' and metric == 'symmetry'")  # doctest: +SKIP
    """
    return build_atlas(models, out=out, from_file=from_file, hf_cache=hf_cache, metrics=metrics, precision=precision,
                       fold_ln=fold_ln, fold_qk_norm=fold_qk_norm, device=device, scheduler=scheduler,
                       workers=workers, threads=threads, progress=progress, behaviour=behaviour,
                       sequences=sequences, length=length, seed=seed).read()
