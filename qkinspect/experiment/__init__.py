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
