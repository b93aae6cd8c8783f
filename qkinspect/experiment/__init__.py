"""Edit the attention heads of a trained model and measure what it costs (docs/experiments.md)."""

from qkinspect.experiment.edits import EDITS, Edit, EditResult, apply_edit, expand_kv, parse_edit

__all__ = ["EDITS", "Edit", "EditResult", "apply_edit", "expand_kv", "parse_edit"]
