"""The atlas: many models of any family, shape and format, compared on normalised depth (docs/atlas.md).

Rooms: `request` (the options checked once, torch-free, in the caller's names), `inputs` (which models: named,
from a file, from the local Hugging Face cache), `run` (`atlas`, `build_atlas`: analysed on the sweep's engine,
resumable), `stats` (the per-model statistics, pure functions of each model's analysis), `results` (`AtlasResult`:
tidy records (`AtlasRecord`), facts, failures), `folder` (the folder's layout and manifest), `saved` (`read_atlas`,
the checked reader). Its table for people is `qkinspect.terminal.atlas`, its pages `qkinspect.report.atlas`.

    qkinspect.atlas(models, out=...) -> AtlasResult     all of it in one call (the package is callable)
    qkinspect.read_atlas(folder) -> AtlasResult          the folder read back, every file checked

The folder keeps the analyses, so everything is computed again, the same, when the folder is read.
"""

from __future__ import annotations

from qkinspect.faces import make_face

# Imported on use: `plot` and `report` ask `is_atlas` of every model argument, and must stay free of numpy and torch.
_NAMES = {"SavedEntry": "inputs", "entries": "inputs", "hf_cache_models": "inputs", "is_atlas": "folder",
          "AtlasRequest": "request", "check_request": "request", "AtlasResult": "results", "AtlasRecord": "results",
          "read_atlas": "saved",
          "atlas": "run", "build_atlas": "run", "run_atlas": "run"}

make_face(__name__, _NAMES, call="atlas")

__all__ = sorted(_NAMES)
