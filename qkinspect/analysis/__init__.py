"""The analysis (`qkinspect.analyze`): a model in, per-head and per-layer records out, in experiment/'s rooms.

- `request.py`: what an analysis is asked to do, checked once, torch-free, in the caller's option names
  (`qkinspect.names`): metrics, the selection (blocks, layers, heads), spectra, precision, device, folds, the
  layer form (`check_request`); then against the model's description, before any weight is read (`check_model`);
- `run.py`: `analyze`, torch-free until the request and the model are checked; `engine.py`: `measure`, layers read
  one at a time and measured batched over their heads;
- `results.py`: the typed records (`AnalysisResult`, `HeadRecord`, `LayerRecord`, `Baseline`), `document`, `save`,
  a table in a notebook, `to_pandas`;
- `saved.py`: the checked reader of `analyze -o run.json` (`read_saved`), returning the same records;
- beside them, the library calls of the commands built on an analysis: `spectrum.py` (one head analysed, its
  spectrum as rows), `compare.py` (two models analysed and compared head for head, B − A) and `info.py` (what a
  checkpoint holds, no weight read).
Its table for people: `qkinspect.terminal.tables`; its pages: `qkinspect.report.analysis`.

This face names the public API lazily (importing the package loads no torch): `analyze`, `read_saved`,
`is_saved`, `AnalysisResult`, `HeadRecord`, `LayerRecord`, `Baseline`, `AnalysisRequest`, `check_request`.
"""

from __future__ import annotations

from importlib import import_module

_HOMES = {
    "analyze": "run",
    "read_saved": "saved",
    "is_saved": "saved",
    "AnalysisResult": "results",
    "HeadRecord": "results",
    "LayerRecord": "results",
    "Baseline": "results",
    "AnalysisRequest": "request",
    "check_request": "request",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(import_module(f"qkinspect.analysis.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'qkinspect.analysis' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
