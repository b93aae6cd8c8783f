"""Hand-built AnalysisResults with known numbers, for testing presentation without running the metrics."""

from __future__ import annotations

import math

from qkinspect.analysis.results import AnalysisResult, Baseline, HeadRecord, LayerRecord
from qkinspect.layer import BlockSpec, ModelInfo
from qkinspect.processing import Processing


def info(name: str = "m", n_heads: int = 2, n_layers: int = 2, d_model: int = 8) -> ModelInfo:
    spec = BlockSpec("encoder", n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_heads, d_model=d_model, d_head=4)
    return ModelInfo(name=name, source=name, model_type="bert", format="safetensors", blocks=(spec,))


def result(sym: dict[tuple[int, int], float], name: str = "m") -> AnalysisResult:
    """Heads (layer, head) -> symmetry; overlap_qk = symmetry / 2 (NaN stays NaN)."""
    heads = [HeadRecord("encoder", layer, head, head, {"symmetry": s, "overlap_qk": s / 2})
             for (layer, head), s in sorted(sym.items())]
    layers = [LayerRecord("encoder", layer, 2, {"symmetry_median": 0.0}) for layer in sorted({k[0] for k in sym})]
    return AnalysisResult(model=info(name), processing=Processing(), heads=heads, layers=layers,
                          baselines=[Baseline("encoder", "symmetry", 0.001, 0.002, 64)],
                          metric_names=["symmetry", "overlap_qk"])


NAN = math.nan
