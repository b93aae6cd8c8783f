"""Edit the attention heads of a trained model and measure what it costs (docs/experiments.md)."""

from qkinspect.experiment.edit_names import EDITS, Edit, EditError, parse_edit

__all__ = ["EDITS", "PREDICTORS", "Edit", "EditError", "EditResult", "apply_edit", "expand_kv", "parse_edit"]

# Lazy: the edits need torch, running a model needs transformers; the names above need neither, so that a misspelt
# edit is refused at once.
_EDITS = ("PREDICTORS", "EditResult", "apply_edit", "expand_kv")
_RUN = ("run_experiment", "ExperimentResult", "Run")


def __getattr__(name: str):
    if name in _EDITS:
        from qkinspect.experiment import edits

        return getattr(edits, name)
    if name in _RUN:
        from qkinspect.experiment import run

        return getattr(run, name)
    raise AttributeError(f"module 'qkinspect.experiment' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_RUN})
