"""An AnalysisResult read into arrays for the analysis report's figures and tables: layer x head grids, per-block
value lists, spectra, the records of a layer.

Only reading and arranging records here (report/ never computes a metric); the grid drawn is the shared
`qkinspect.report.grid.Grid`.
"""

from __future__ import annotations

import numpy as np

from qkinspect.analysis.results import AnalysisResult
from qkinspect.errors import InputError
from qkinspect.report.grid import Grid


def blocks_of(result: AnalysisResult) -> list[str]:
    """Keys of the blocks that have head records, in the model's order (encoder, decoder, cross; or tower labels)."""
    present = {h.block for h in result.heads}
    return [b.key for b in result.model.blocks if b.key in present]


def head_grid(result: AnalysisResult, block: str, metric: str) -> Grid:
    """The layer x head grid of `metric` for `block`; only layers and heads that were analysed."""
    recs = [h for h in result.heads if h.block == block]
    layers = sorted({h.layer for h in recs})
    heads = sorted({h.head for h in recs})
    li = {v: i for i, v in enumerate(layers)}
    hi = {v: i for i, v in enumerate(heads)}
    values = np.full((len(layers), len(heads)), np.nan)  # (n_layers, n_heads)
    for h in recs:
        values[li[h.layer], hi[h.head]] = h.values.get(metric, np.nan)
    return Grid(block, metric, layers, heads, values)


def has_metric(result: AnalysisResult, metric: str) -> bool:
    return any(np.isfinite(h.values.get(metric, np.nan)) for h in result.heads)


def require(result: AnalysisResult, *metrics: str, kind: str) -> None:
    """InputError naming the metrics a figure needs when the analysis did not compute them."""
    missing = [m for m in metrics if not has_metric(result, m)]
    if missing:
        raise InputError(
            f"the {kind} figure needs the metric(s) {', '.join(missing)}, which this analysis does not hold "
            f"(run analyze without a --metrics filter that excludes them)"
        )


def block_values(result: AnalysisResult, block: str, metric: str) -> np.ndarray:
    """Finite values of a head metric over every analysed head of a block."""
    v = np.array([h.values.get(metric, np.nan) for h in result.heads if h.block == block], dtype=float)
    return v[np.isfinite(v)]


def spectra_of(result: AnalysisResult, block: str, layer: int, key: str = "qk") -> dict[int, np.ndarray]:
    """head -> singular values (descending) of one layer, for heads whose spectrum was kept."""
    out = {}
    for (b, l, h), spec in result.spectra.items():
        if b == block and l == layer and key in spec:
            out[h] = np.asarray(spec[key], dtype=float)
    return dict(sorted(out.items()))


def spectra_layers(result: AnalysisResult, key: str = "qk") -> list[tuple[str, int]]:
    """(block, layer) pairs that have spectra, in model order."""
    order = {b: i for i, b in enumerate(blocks_of(result))}
    pairs = {(b, l) for (b, l, _h), spec in result.spectra.items() if key in spec}
    return sorted(pairs, key=lambda p: (order.get(p[0], 99), p[1]))


def layer_record(result: AnalysisResult, block: str, layer: int):
    for r in result.layers:
        if r.block == block and r.layer == layer:
            return r
    return None


def d_head(result: AnalysisResult, block: str) -> int:
    return result.model.block(block).d_head


def renamed(result: AnalysisResult, name: str | None) -> AnalysisResult:
    """The same records under another name (a report's --title), for the titles that name the model."""
    if not name:
        return result
    from dataclasses import replace

    return replace(result, model=replace(result.model, name=name))


def title(result: AnalysisResult, what: str) -> str:
    """Figure title: the model's name, then what is shown."""
    return f"{result.model.name}: {what}"
