"""The work of a sweep, one checkpoint at a time: pure functions that Dask runs on its workers.

Each takes a checkpoint spec and the options and returns plain JSON-ready data; nothing here touches the sweep's
folder (the client writes results as they arrive), so a task can run on any worker that can read the checkpoint.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import Any

from qkinspect.limits import cores


def describe(spec: str, revision: str | None) -> dict[str, Any]:
    """The model's identity and attention shapes (schema qkinspect/1's `model`), read without any weights."""
    from qkinspect.documents import model_dict
    from qkinspect.loading import open_model

    with open_model(spec, revision=revision) as m:
        return model_dict(m.info)


def analyze_checkpoint(spec: str, revision: str | None, options: dict[str, Any], *, device: str = "cpu",
                       threads: int | None = None, extend: Callable[..., dict[str, Any]] | None = None
                       ) -> dict[str, Any]:
    """`qkinspect.analyze` on one checkpoint with `options` (layers, heads, blocks, metrics, precision, fold_ln,
    fold_qk_norm, layer_form): its schema-qkinspect/1 dict, plus where, with how many torch threads, and how long
    it ran. `fold_qk_norm` folds where the model has q/k norms; a model without them is measured as stored (the
    atlas's models differ; the sweep command refuses the option for checkpoints without q/k norms before any work).

    `threads` (torch intra-op threads) defaults to this machine's cores shared among the worker's task slots.
    With the atlas's `behaviour` option, `extend` (the atlas passes qkinspect.atlas.behaviour.join: `qkinspect.heads`
    on the same model, in the same task) adds its scores and relations to the analysis; the engine knows nothing
    of it, so the sweep imports neither the atlas nor heads.
    """
    from qkinspect import analysis  # the analysis package's face, not qkinspect's

    t0 = time.perf_counter()
    behaviour = options.get("behaviour")
    options = {k: v for k, v in options.items() if k != "behaviour"}
    threads = threads or _share_of_cores()
    if options.get("fold_qk_norm") and not any(b["qk_norm"] for b in describe(spec, revision)["blocks"]):
        options = {**options, "fold_qk_norm": False}  # nothing to fold (an atlas's models without q/k norms)
    result = analysis.analyze(spec, revision=revision, device=device, spectra=None, threads=threads, **options)
    if not result.heads:
        from qkinspect.errors import InputError

        raise InputError(f"{spec}: the selection matched no heads")
    doc = result.document()
    if behaviour:
        if extend is None:
            raise ValueError("the behaviour option needs the atlas's extend (qkinspect.atlas.behaviour.join)")
        doc = extend(spec, revision, doc, behaviour, options, device=device, threads=threads)
    return {"result": doc, "worker": _worker_name(), "threads": threads,
            "seconds": time.perf_counter() - t0}


def _share_of_cores() -> int:
    """The cores this process may use divided by the tasks the Dask worker runs at once (1 outside a worker)."""
    try:
        from distributed import get_worker

        slots = get_worker().state.nthreads
    except (ImportError, ValueError, AttributeError):
        slots = 1
    return max(1, cores() // max(1, slots))


def _worker_name() -> str:
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError, AttributeError):
        return f"{socket.gethostname()}:{os.getpid()}"
