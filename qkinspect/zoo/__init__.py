"""The atlas: many models of any family, shape and format, compared on normalised depth (docs/atlas.md).

    entries(models, from_file=, hf_cache=)       which models (and saved analyses)      (inputs.py)
    run_atlas(items, options, folder, ...)        analyse on the sweep's engine, resume  (run.py)
    read_atlas(folder) -> AtlasResult             tidy records, facts, failures          (result.py, stats.py)
    qkinspect.atlas(models, out=...)              all of it in one call                  (run.py)

The per-model statistics are pure functions of each model's analysis (stats.py); the folder keeps the analyses
(folder.py), so everything is computed again, the same, when the folder is read.
"""

from __future__ import annotations

import importlib

# Imported on use: `plot` and `report` ask `is_atlas` of every model argument, and must stay free of numpy and torch.
_NAMES = {"SavedEntry": "inputs", "entries": "inputs", "hf_cache_models": "inputs", "is_atlas": "folder",
          "AtlasResult": "result", "read_atlas": "result", "atlas": "run", "run_atlas": "run"}


def __getattr__(name: str):
    if name in _NAMES:
        return getattr(importlib.import_module(f"qkinspect.zoo.{_NAMES[name]}"), name)
    raise AttributeError(f"module 'qkinspect.zoo' has no attribute {name!r}")


__all__ = sorted(_NAMES)
