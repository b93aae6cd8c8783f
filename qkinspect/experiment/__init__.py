"""Edit the attention heads of a trained model and measure what it costs (docs/experiments.md)."""

from qkinspect.experiment.edits import (
    EDITS,
    PREDICTORS,
    Edit,
    EditError,
    EditResult,
    apply_edit,
    expand_kv,
    parse_edit,
)

__all__ = ["EDITS", "PREDICTORS", "Edit", "EditError", "EditResult", "apply_edit", "expand_kv", "parse_edit"]

# Running a model (transformers) is imported lazily: the edits above need only torch.


def __getattr__(name: str):
    if name in ("run_experiment", "ExperimentResult", "Run"):
        from qkinspect.experiment import run

        return getattr(run, name)
    raise AttributeError(f"module 'qkinspect.experiment' has no attribute {name!r}")
