"""Where the twin's runs go (docs/twin.md, "Engine"): one choice, made here.

- `scheduler` given: that cluster (`qkinspect.sweep.engine.connect`). Where its workers declare a `GPU` resource
  (`dask cuda worker`, or `dask worker --resources GPU=1` started with its own CUDA_VISIBLE_DEVICES), each task asks
  for one unit of it, so a worker runs one task per GPU it holds; the task's `cuda` is its worker's first visible
  device.
- `device="cuda"` and dask-cuda installed: a `LocalCUDACluster`, one worker per GPU (`workers`: at most that many),
  each worker's CUDA_VISIBLE_DEVICES set by dask-cuda to its own GPU first, so every task runs on its worker's GPU.
- otherwise the local cluster of processes the sweep engine starts (today's CPU cluster, and the cuda one where
  dask-cuda is absent: every worker on the first GPU).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Iterator
from typing import Any

from qkinspect.names import Names

GPU = "GPU"  # the worker resource a GPU task asks for


def cluster_kind(device: str, scheduler: str | None) -> str:
    """`scheduler`, `local-cuda` (dask-cuda's LocalCUDACluster) or `local` (the sweep engine's LocalCluster)."""
    if scheduler is not None:
        return "scheduler"
    if device == "cuda" and _dask_cuda() is not None:
        return "local-cuda"
    return "local"


def _dask_cuda() -> Any:
    try:
        return importlib.import_module("dask_cuda")
    except ImportError:
        return None


@contextlib.contextmanager
def twin_cluster(device: str, scheduler: str | None, workers: int | None, threads: int | None, n_tasks: int,
                 names: Names) -> Iterator[tuple[Any, int | None, dict[str, Any]]]:
    """A Dask client for the twin's tasks, the torch threads each task uses, and what each `submit` adds (the GPU
    resource on a scheduler whose workers declare one)."""
    from qkinspect.sweep.engine import connect

    kind = cluster_kind(device, scheduler)
    if kind == "local-cuda":
        from distributed import Client

        logging.getLogger("distributed").setLevel(logging.ERROR)
        options: dict[str, Any] = {"threads_per_worker": 1, "silence_logs": logging.CRITICAL,
                                   "dashboard_address": "127.0.0.1:0"}
        if workers:
            options["n_workers"] = workers
        cluster = _dask_cuda().LocalCUDACluster(**options)
        with contextlib.closing(cluster), contextlib.closing(Client(cluster)) as client:
            yield client, threads or 1, {}
        return
    with connect(scheduler, workers, threads, n_tasks, names) as (client, task_threads):
        extra = {"resources": {GPU: 1}} if kind == "scheduler" and device == "cuda" and _declares_gpu(client) else {}
        yield client, task_threads, extra


def _declares_gpu(client) -> bool:
    """Whether every worker of the cluster declares a GPU resource (then each task asks for one)."""
    workers = client.scheduler_info().get("workers", {})
    return bool(workers) and all(GPU in (w.get("resources") or {}) for w in workers.values())
