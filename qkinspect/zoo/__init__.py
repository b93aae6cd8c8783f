"""The atlas: many models of any family, shape and format, compared on normalised depth (docs/atlas.md).

    entries(models, from_file=, hf_cache=)       which models (and saved analyses)      (entries.py)
    run_atlas(items, options, folder, ...)        analyse on the sweep's engine, resume  (run.py)
    read_atlas(folder) -> AtlasResult             tidy records, facts, failures          (result.py, stats.py)
    qkinspect.atlas(models, out=...)              all of it in one call                  (run.py)

The per-model statistics are pure functions of each model's analysis (stats.py); the folder keeps the analyses
(folder.py), so everything is computed again, the same, when the folder is read.
"""

from __future__ import annotations

from qkinspect.zoo.entries import SavedEntry, entries, hf_cache_models
from qkinspect.zoo.folder import is_atlas
from qkinspect.zoo.result import AtlasResult, read_atlas


def atlas(*args, **kwargs):
    """See qkinspect.zoo.run.atlas (imported on use)."""
    from qkinspect.zoo.run import atlas as run

    return run(*args, **kwargs)


def run_atlas(*args, **kwargs):
    """See qkinspect.zoo.run.run_atlas (imported on use)."""
    from qkinspect.zoo.run import run_atlas as run

    return run(*args, **kwargs)


__all__ = ["AtlasResult", "SavedEntry", "atlas", "entries", "hf_cache_models", "is_atlas", "read_atlas",
           "run_atlas"]
