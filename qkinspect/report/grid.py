"""The grid every layer x head heatmap draws (`qkinspect.report.heatmap`): one value per layer and head, read
from an analysis (`qkinspect.report.analysis.arrays.head_grid`) or from an experiment's runs and estimates
(`qkinspect.report.experiment`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Grid:
    """Values of one metric for one block: `values[i, j]` is layer `layers[i]`, head `heads[j]` (NaN if absent)."""

    block: str
    metric: str
    layers: list[int]
    heads: list[int]
    values: np.ndarray  # (n_layers, n_heads)
