"""Edit the attention heads of a trained model and measure what it costs (docs/experiments.md).

In layers, bottom up: `edits` (names, the pure edits, their forms, the rotary gauge, their parametrisations for
healing); `model` (the transformers runtime: staging and guarding, write-back, models in memory, scoring); and the
procedures: `run` (run_experiment, the orchestrator), `exact` (one exact run per unit), `estimate` (every head at
once, verified by exact runs) and `heal`. `requests` checks what is asked before anything loads; `results` holds the
records and writes the JSON document, `saved` reads one back, checked, into the same records, and `costs` says
what the runs cost per edit, per head and per K.
"""

from qkinspect.experiment.edits.names import EDITS, Edit, EditError, parse_edit

__all__ = ["EDITS", "PREDICTORS", "Edit", "EditError", "EditResult", "apply_edit", "expand_kv", "parse_edit"]

# Lazy: the edits need torch, running a model needs transformers; the names above need neither, so that a misspelt
# edit is refused at once.
_EDITS = ("PREDICTORS", "EditResult", "apply_edit", "expand_kv")
_RUN = ("run_experiment",)
_RESULTS = ("ExperimentResult", "Run")


def __getattr__(name: str):
    if name in _EDITS:
        from qkinspect.experiment.edits import apply

        return getattr(apply, name)
    if name in _RUN:
        from qkinspect.experiment import run

        return getattr(run, name)
    if name in _RESULTS:
        from qkinspect.experiment import results

        return getattr(results, name)
    raise AttributeError(f"module 'qkinspect.experiment' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_RUN, *_RESULTS})
