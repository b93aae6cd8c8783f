"""`qkinspect sweep`: the same analysis over many checkpoints (a training run's steps, hub revisions, models of
one shape), run by Dask distributed on this machine or a cluster, written one result file per checkpoint, resumable.

    discover(specs, revisions)  -> [Checkpoint]      which checkpoints, and their steps   (checkpoints.py)
    run_sweep(checkpoints, options, folder, ...)     analyse, write, resume               (engine.py)
    read_sweep(folder).rows(by="head")               the tidy table (a SweepResult)       (store.py)

Needs the `sweep` extra (dask[distributed]; pyarrow for Parquet).
"""

from __future__ import annotations

from qkinspect.sweep.checkpoints import Checkpoint, discover
from qkinspect.sweep.keys import Failure
from qkinspect.sweep.store import SweepFolder, SweepResult, is_sweep_folder, read_sweep


def run_sweep(*args, **kwargs):
    """See qkinspect.sweep.engine.run_sweep (imported on use: it needs dask)."""
    from qkinspect.sweep.engine import run_sweep as run

    return run(*args, **kwargs)


__all__ = ["Checkpoint", "Failure", "SweepFolder", "SweepResult", "discover", "is_sweep_folder", "read_sweep",
           "run_sweep"]
