"""Synthetic AnalysisResults of any shape, for fast figure tests that do not need a checkpoint.

Values are drawn to look like real models (symmetry mostly positive, overlaps above the random baseline) so the
figures can be inspected; the real `analyze` output is tested separately."""

from __future__ import annotations

import numpy as np

from qkinspect.analysis.results import AnalysisResult, Baseline, HeadRecord, LayerRecord
from qkinspect.layer import BlockSpec, ModelInfo
from qkinspect.processing import Processing


def block(name="encoder", n_layers=4, n_heads=8, n_kv_heads=None, d_model=64, d_head=8) -> BlockSpec:
    return BlockSpec(name, n_layers, n_heads, n_kv_heads or n_heads, d_model, d_head)


def model(*blocks: BlockSpec, name="synthetic-model") -> ModelInfo:
    return ModelInfo(name=name, source="/tmp/none", model_type="bert", format="safetensors",
                     blocks=tuple(blocks or (block(),)), dtype="float32", architecture="BertModel")


def _head_values(rng, d: int, d_model: int) -> dict[str, float]:
    sv = np.sort(rng.gamma(1.0, 1.0, d))[::-1]
    p = sv / sv.sum()
    e = sv**2
    return {
        "symmetry": float(np.clip(rng.normal(0.25, 0.2), -1, 1)),
        "directionality": float(rng.uniform(-0.5, 0.5)),
        "qk_effective_rank": float(np.exp(-(p * np.log(p)).sum())),
        "qk_stable_rank": float(e.sum() / e[0]),
        "qk_participation_ratio": float(e.sum() ** 2 / (e**2).sum()),
        "qk_k90": float(np.searchsorted(np.cumsum(e) / e.sum(), 0.9) + 1),
        "overlap_qk": float(rng.uniform(d / d_model, 0.6)),
        "overlap_qv": float(rng.uniform(d / d_model, 0.4)),
        "overlap_kv": float(rng.uniform(d / d_model, 0.5)),
    }, sv


def result(*blocks: BlockSpec, name="synthetic-model", seed=0, spectra=True) -> AnalysisResult:
    """An AnalysisResult with head, layer, baseline and spectrum records for the given blocks."""
    rng = np.random.default_rng(seed)
    info = model(*blocks, name=name)
    heads, layers, spec, base = [], [], {}, []
    for b in info.blocks:
        for layer in range(b.n_layers):
            vals = []
            for h in range(b.n_heads):
                v, sv = _head_values(rng, b.d_head, b.d_model)
                heads.append(HeadRecord(b.name, layer, h, h // b.group_size, v))
                vals.append(v)
                if spectra:
                    spec[(b.name, layer, h)] = {"qk": sv}
            overlap = rng.uniform(b.d_head / b.d_model, 0.5, (b.n_heads, b.n_heads))  # (H, H)
            overlap = (overlap + overlap.T) / 2
            np.fill_diagonal(overlap, 1.0)
            sym = [v["symmetry"] for v in vals]
            lv = {"symmetry_median": float(np.median(sym)), "symmetry_mean": float(np.mean(sym)),
                  "overlap_qk_median": float(np.median([v["overlap_qk"] for v in vals])),
                  "qk_effective_rank_median": float(np.median([v["qk_effective_rank"] for v in vals]))}
            layers.append(LayerRecord(b.name, layer, b.n_heads, lv, overlap))
        base.append(Baseline(b.name, "symmetry", 0.0, 0.02, 64))
        for m in ("overlap_qk", "overlap_qv", "overlap_kv"):
            base.append(Baseline(b.name, m, b.d_head / b.d_model, 0.01, 64))
    names = sorted(heads[0].values) if heads else []
    return AnalysisResult(info, Processing(), heads, layers, base, spec, [], names)
