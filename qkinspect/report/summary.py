"""The report's one-page summary in plain words, built from the records (no metric is computed here: medians and
rankings of the per-head values only)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qkinspect.records import AnalysisResult, HeadRecord
from qkinspect.report.grid import block_values, blocks_of
from qkinspect.report.style import NUMBER_NOTE, fmt

N_EXTREMES = 3  # how many most / least symmetric heads the summary names
CHANCE_SDS = 3.0  # a median within this many baseline standard deviations of the baseline mean is "chance level"


@dataclass(frozen=True)
class Section:
    """A titled list of paragraphs."""

    title: str
    paragraphs: list[str]


def summary(result: AnalysisResult) -> list[Section]:
    """Plain-words findings per block: symmetry against chance, the extreme heads, how low-rank W_QK is,
    Q/K overlap, then caveats (rotary positions, warnings) and how numbers are rounded.

    Example:
        >>> for s in summary(result):
        ...     print(s.title, *s.paragraphs, sep="\\n")
    """
    out = [Section(_block_title(result, b), _block_paragraphs(result, b)) for b in blocks_of(result)]
    notes = [NUMBER_NOTE, *_caveats(result)]
    out.append(Section("Notes", notes))
    return out


def _block_title(result: AnalysisResult, block: str) -> str:
    b = result.model.block(block)
    n = sum(1 for h in result.heads if h.block == block)
    return f"{block}: {n} heads in {b.n_layers} layers (d_model = {b.d_model}, d_head = {b.d_head})"


def _block_paragraphs(result: AnalysisResult, block: str) -> list[str]:
    parts = [_symmetry_sentence(result, block), _extremes_sentence(result, block), _sharing_sentence(result, block),
             _rank_sentence(result, block), _overlap_sentence(result, block), _layer_form_sentence(result, block)]
    return [p for p in parts if p]


def _symmetry_sentence(result: AnalysisResult, block: str) -> str:
    v = block_values(result, block, "symmetry")
    if not v.size:
        return ""
    med = float(np.median(v))
    q25, q75 = np.percentile(v, [25, 75])
    text = (f"How symmetric. The median symmetry score of W_Q W_Kᵀ is {fmt(med)} (mean {fmt(v.mean())}; "
            f"the middle half of the heads lie between {fmt(q25)} and {fmt(q75)}; 1 would mean W_Q W_Kᵀ is "
            f"symmetric, as when queries and keys share one matrix, and 0 is what unrelated W_Q and W_K give).")
    base = result.baseline(block, "symmetry")
    if base is None:
        return text
    hi = base.mean + CHANCE_SDS * base.std
    lo = base.mean - CHANCE_SDS * base.std
    above, below = int((v > hi).sum()), int((v < lo).sum())
    verdict = ("at chance level" if lo <= med <= hi
               else "far more symmetric than chance" if med > hi else "more antisymmetric than chance")
    return (f"{text} Random Gaussian W_Q and W_K of the same shapes give {fmt(base.mean)} ± {fmt(base.std)}, "
            f"so this block is {verdict}: {above} of {v.size} heads lie above the random band "
            f"(mean ± {CHANCE_SDS:g} sd) and {below} below it.")


def _ranked(result: AnalysisResult, block: str) -> list[HeadRecord]:
    recs = [h for h in result.heads if h.block == block and np.isfinite(h.values.get("symmetry", np.nan))]
    return sorted(recs, key=lambda h: h.values["symmetry"], reverse=True)


def _extremes_sentence(result: AnalysisResult, block: str) -> str:
    recs = _ranked(result, block)
    if len(recs) < 2:
        return ""
    k = min(N_EXTREMES, len(recs) // 2)

    def names(hs: list[HeadRecord]) -> str:
        return ", ".join(f"layer {h.layer} head {h.head} ({fmt(h.values['symmetry'])})" for h in hs)

    return (f"Most symmetric heads: {names(recs[:k])}. "
            f"Least symmetric heads: {names(list(reversed(recs[-k:])))}.")


def _sharing_sentence(result: AnalysisResult, block: str) -> str:
    recs = [h for h in result.heads if h.block == block and np.isfinite(h.values.get("shared_qk_distance", np.nan))]
    if not recs:
        return ""
    v = np.array([h.values["shared_qk_distance"] for h in recs])
    best = recs[int(np.argmin(v))]
    base = result.baseline(block, "shared_qk_distance")
    chance = ("about 0.87 for random weights" if base is None
              else f"{fmt(base.mean)} ± {fmt(base.std)} for random Gaussian weights of the same shapes")
    return (f"Could queries and keys share one matrix? The median head's W_Q W_Kᵀ lies {fmt(float(np.median(v)))} "
            f"(relative Frobenius distance) from the nearest form one shared matrix W gives (W Wᵀ: symmetric "
            f"positive semi-definite; 0 = some re-basing makes W_K = W_Q, {chance}, 1 for a skew or negative "
            f"form). The closest is layer {best.layer} head {best.head} ({fmt(best.values['shared_qk_distance'])}).")


def _rank_sentence(result: AnalysisResult, block: str) -> str:
    d = result.model.block(block).d_head
    eff = block_values(result, block, "qk_effective_rank")
    if not eff.size:
        return ""
    med = float(np.median(eff))
    text = (f"How low-rank. W_Q W_Kᵀ has rank at most d_head = {d}. The median head's effective rank is "
            f"{fmt(med)} ({fmt(med / d)} of d_head)")
    stable = block_values(result, block, "qk_stable_rank")
    if stable.size:
        text += f"; its stable rank is {fmt(float(np.median(stable)))}"
    k90 = block_values(result, block, "qk_k90")
    if k90.size:
        text += f"; 90% of its squared singular-value energy lies in {fmt(float(np.median(k90)))} dimensions"
    shape = "strongly low-rank" if med < d / 4 else "moderately low-rank" if med < d / 2 else "close to full rank"
    return f"{text}. So W_Q W_Kᵀ is {shape} within its d_head dimensions."


def _overlap_sentence(result: AnalysisResult, block: str) -> str:
    v = block_values(result, block, "overlap_qk")
    if not v.size:
        return ""
    text = (f"Shared subspaces. The column spaces of W_Q and W_K overlap by {fmt(float(np.median(v)))} "
            f"(median mean cos² of principal angles; 1 = the same subspace)")
    base = result.baseline(block, "overlap_qk")
    if base is not None:
        text += f", against {fmt(base.mean)} ± {fmt(base.std)} for random subspaces"
    return text + "."


def _layer_form_sentence(result: AnalysisResult, block: str) -> str:
    v = np.array([r.values.get("symmetry_layer", np.nan) for r in result.layers if r.block == block], dtype=float)
    v = v[np.isfinite(v)]
    if not v.size:
        return ""
    return (f"Layer form. Summing W_Q W_Kᵀ over each layer's heads (as Saponati et al. 2025 tabulate), the "
            f"median symmetry over layers is {fmt(float(np.median(v)))}.")


def _caveats(result: AnalysisResult) -> list[str]:
    out = []
    for b in result.model.blocks:
        if b.positional == "rope":
            out.append(f"The {b.key} block uses rotary position embeddings: W_Q W_Kᵀ describes the score between "
                       "tokens at the same position (offset 0); other offsets rotate it.")
    p = result.processing
    out.append(f"Weights were measured {'with' if p.fold_ln else 'without'} LayerNorm folding"
               f"{', with q/k-norm gains folded' if p.fold_qk_norm else ''}, in {p.precision}.")
    if result.warnings:
        shown = result.warnings[:5]
        more = len(result.warnings) - len(shown)
        out.append("Warnings from the analysis: " + "; ".join(shown) + (f"; and {more} more." if more else "."))
    return out
