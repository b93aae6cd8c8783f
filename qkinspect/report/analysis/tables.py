"""The analysis report's per-layer tables: the layer records as analyze reports them, and per-layer medians over
heads of the head metrics that layer records do not summarise; and which metrics the report shows (what its
Definitions pages define). Drawn as the shared `qkinspect.report.tables.Table`."""

from __future__ import annotations

import numpy as np

from qkinspect.analysis.results import AnalysisResult
from qkinspect.metrics.registry import INTEGER_METRICS
from qkinspect.report.analysis.arrays import blocks_of, has_metric, head_grid
from qkinspect.report.style import count_text, fmt
from qkinspect.report.tables import Table

# Head metrics drawn by the report's figures (its Definitions pages define these and the tables' columns only).
FIGURE_METRICS = ("symmetry", "overlap_qk", "overlap_qv", "overlap_kv", "qk_effective_rank", "qk_stable_rank",
                  "qk_k90", "head_overlap")
# Head metrics worth a per-layer median column when the layer records do not already hold one.
HEAD_MEDIANS = ("symmetry", "directionality", "qk_effective_rank", "qk_stable_rank", "qk_participation_ratio",
                "qk_k90", "shared_qk_distance", "overlap_qk", "overlap_qv", "overlap_kv")


def layer_tables(result: AnalysisResult) -> list[Table]:
    """For each block: its layer records' values, then medians over heads (where the records lack them).

    Example:
        >>> for t in layer_tables(result):
        ...     print(t.title, t.header)
    """
    out = []
    for block in blocks_of(result):
        recs = sorted((r for r in result.layers if r.block == block), key=lambda r: r.layer)
        names = list(dict.fromkeys(k for r in recs for k in r.values))
        if names:
            rows = [[str(r.layer), *(fmt(r.values.get(k, np.nan)) for k in names)] for r in recs]
            out.append(Table(f"{block}: per-layer values (layer records)", ["layer", *names], rows))
        medians = [m for m in HEAD_MEDIANS if has_metric(result, m) and f"{m}_median" not in names]
        if medians:
            out.append(_median_table(result, block, medians))
    return out


def _median_table(result: AnalysisResult, block: str, metrics: list[str]) -> Table:
    grids = [head_grid(result, block, m) for m in metrics]
    layers = grids[0].layers
    cols = []
    for g in grids:
        finite = np.isfinite(g.values).any(axis=1)  # (n_layers,)
        med = np.full(len(layers), np.nan)
        med[finite] = np.nanmedian(g.values[finite], axis=1)  # (n_layers, n_heads) -> (n_layers,)
        cols.append(med)
    rows = [[str(layer), *(_cell(m, c[i]) for m, c in zip(metrics, cols, strict=True))]
            for i, layer in enumerate(layers)]
    return Table(f"{block}: per-layer median over heads", ["layer", *metrics], rows)


def _cell(metric: str, v: float) -> str:
    return count_text(v) if metric in INTEGER_METRICS else fmt(v)


def shown_metrics(result: AnalysisResult) -> list[str]:
    """The metrics the report shows (figures, table columns, medians), in the analysis' order: what it defines."""
    shown = set(FIGURE_METRICS) | {h for t in layer_tables(result) for h in t.header}
    shown |= {h.removesuffix("_median") for h in shown}
    return [m for m in result.metric_names if m in shown]
