"""The report's one-page summary in plain words, built from the records (no metric is computed here: medians and
rankings of the per-head values only)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qkinspect.analysis.results import AnalysisResult, HeadRecord
from qkinspect.report.analysis.arrays import block_values, blocks_of
from qkinspect.report.style import NUMBER_NOTE, count_text, fmt

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


def raw_qk_norm_blocks(result: AnalysisResult) -> list[str]:
    """The analysed blocks that normalise queries and keys (q/k norm) measured without their gains folded in: their
    W_Q W_Kᵀ is the raw stored form, not the one attention computes."""
    if result.processing.fold_qk_norm:
        return []
    present = set(blocks_of(result))
    return [b.key for b in result.model.blocks if b.qk_norm and b.key in present]


def qk_norm_notice(result: AnalysisResult, block: str | None = None) -> str:
    """In plain words, for a model with q/k norms measured raw: what the numbers are not, and how to get the form
    attention computes; "" when there is nothing to say (no q/k norm, or the gains were folded)."""
    return qk_norm_notice_of(raw_qk_norm_blocks(result), block)


def qk_norm_notice_of(blocks: list[str], block: str | None = None) -> str:
    """qk_norm_notice for the blocks measured raw (a sweep's results name them in processing.qk_norm_not_folded)."""
    if not blocks or (block is not None and block not in blocks):
        return ""
    which = f"The {block} block" if block is not None else f"The {_and(blocks)} block{'s' if len(blocks) > 1 else ''}"
    return (f"Not what attention computes. {which} normalises queries and keys (q/k norm) with learned per-dimension "
            "gains, and these numbers were measured without them: they describe the raw W_Q W_Kᵀ as stored, not the "
            "form the model's attention scores use. To measure that form, W_Q diag(γ_q γ_k) W_Kᵀ (up to each "
            "token's normalisation scale), run again with --fold-qk-norm (qkinspect report MODEL --fold-qk-norm; "
            "library: analyze(..., fold_qk_norm=True)).")


def qk_norm_caveat(result: AnalysisResult, short: bool = False) -> str:
    """For a caption (a sentence) or, `short`, under a figure's title (a line) that shows W_Q W_Kᵀ of a model with
    q/k norms measured raw: the cover's qk_norm_notice in brief; "" when there is nothing to say."""
    return qk_norm_caveat_of(raw_qk_norm_blocks(result), short)


def qk_norm_caveat_of(blocks: list[str], short: bool = False) -> str:
    """qk_norm_caveat for the blocks measured raw."""
    if not blocks:
        return ""
    which = f"{_and(blocks)} block{'s' if len(blocks) > 1 else ''}"
    if short:
        return f"raw W_Q W_Kᵀ, q/k-norm gains not folded in ({which}; --fold-qk-norm)"
    return (f"Raw W_Q W_Kᵀ, q/k-norm gains not folded in (the {which}): not the form attention computes "
            "(--fold-qk-norm measures it).")


def _block_paragraphs(result: AnalysisResult, block: str) -> list[str]:
    parts = [qk_norm_notice(result, block), _symmetry_sentence(result, block), _extremes_sentence(result, block),
             _sharing_sentence(result, block),
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


# (metric, words) of the rank measures the summary reads, each stated against d_head
RANK_MEASURES = (("qk_effective_rank", "effective rank"), ("qk_stable_rank", "stable rank"),
                 ("qk_k90", "90% of its squared singular-value energy lies in"))
LOW_FRACTION, HIGH_FRACTION = 0.25, 0.5  # of d_head: below a quarter is low, from a half up is high


def _rank_sentence(result: AnalysisResult, block: str) -> str:
    """The median head's effective rank, stable rank and k90, each as a share of d_head, and a verdict that reads
    all three (rank_verdict): a head whose few directions carry its energy is never called close to full rank."""
    d = result.model.block(block).d_head
    medians = {m: float(np.median(v)) for m, _ in RANK_MEASURES if (v := block_values(result, block, m)).size}
    if not medians:
        return ""
    parts = []
    for m, words in RANK_MEASURES:
        if m in medians:
            x = medians[m]
            value = f"{count_text(x)} dimensions" if m == "qk_k90" else fmt(x)
            parts.append(f"{words} {value} ({_share(x, d)} of d_head)")
    text = f"How low-rank. W_Q W_Kᵀ has rank at most d_head = {d}. Medians over the heads: " + "; ".join(parts)
    return f"{text}. {rank_verdict(medians, d)}"


def _share(x: float, d: int) -> str:
    p = 100 * x / d
    return "<1%" if 0 < p < 0.5 else f"{p:.0f}%"


def rank_verdict(medians: dict[str, float], d: int) -> str:
    """What the rank measures shown say together, relative to d_head: "close to full rank" only when every one is
    at least half of d_head, "strongly low-rank" when every one is below a quarter; otherwise which measures are
    low and which are not.

    Example:
        >>> rank_verdict({"qk_effective_rank": 150.0, "qk_stable_rank": 6.5, "qk_k90": 65.5}, 256)
        'So a few directions dominate W_Q W_Kᵀ, beside a long tail of small singular values: its stable rank is ...'
    """
    names = dict(RANK_MEASURES) | {"qk_k90": "k90 (the dimensions holding 90% of the energy)"}
    level = {m: "low" if x < LOW_FRACTION * d else "high" if x >= HIGH_FRACTION * d else "moderate"
             for m, x in medians.items()}
    low = [names[m] for m in medians if level[m] == "low"]
    rest = [names[m] for m in medians if level[m] != "low"]
    moderate = [names[m] for m in medians if level[m] == "moderate"]
    if all(v == "high" for v in level.values()):
        return "So W_Q W_Kᵀ is close to full rank: every measure shown is at least half of d_head."
    if not rest:
        return "So W_Q W_Kᵀ is strongly low-rank: every measure shown is below a quarter of d_head."
    if low:
        return (f"So a few directions dominate W_Q W_Kᵀ, beside a long tail of small singular values: its "
                f"{_and(low)} {_is(low)} below a quarter of d_head, while its {_and(rest)} {_is(rest)} not. It is "
                "not close to full rank.")
    return (f"So W_Q W_Kᵀ is moderately low-rank: its {_and(moderate)} {_is(moderate)} below half of d_head, and no "
            "measure shown is below a quarter of it.")


def _is(words: list[str]) -> str:
    return "is" if len(words) == 1 else "are"


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


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
    raw = raw_qk_norm_blocks(result)
    out.append(f"Weights were measured {'with' if p.fold_ln else 'without'} LayerNorm folding"
               f"{', with q/k-norm gains folded' if p.fold_qk_norm else ''}"
               f"{', without the q/k-norm gains (--fold-qk-norm folds them)' if raw else ''}, in {p.precision}.")
    if result.warnings:
        shown = result.warnings[:5]
        more = len(result.warnings) - len(shown)
        out.append("Warnings from the analysis: " + "; ".join(shown) + (f"; and {more} more." if more else "."))
    return out
