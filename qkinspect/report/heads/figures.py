"""`qkinspect plot HEADS.json --kind heads`: a weight metric against a behaviour score, one dot per head coloured
by layer, each dot's standard error as a vertical bar, with Spearman's ρ over all heads and within layers and their
bootstrap intervals in the title. Reads a `HeadsResult` only: every number drawn was computed by `qkinspect.heads`.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from qkinspect.errors import InputError
from qkinspect.report.style import Canvas, new_figure
from qkinspect.report.titles import suptitle

SCORE_NAMES = {"previous_token": "previous-token score", "induction": "induction score",
               "duplicate_token": "duplicate-token score", "self": "self score", "first_token": "first-token score",
               "entropy": "attention entropy (normalised)"}
DEFAULT_SCORE = {"symmetry": "self", "overlap_qk": "self", "qk_effective_rank": "previous_token"}


def rho_words(r) -> str:
    """"ρ = +0.43 (95 % CI +0.02 to +0.72; p 0.012; 270 heads)"; "ρ undefined (n heads)"."""
    if r is None or r.rho is None:
        return f"ρ undefined ({0 if r is None else r.n} heads)"
    ci = "" if r.low is None else f"95 % CI {r.low:+.2f} to {r.high:+.2f}; "
    p = "" if r.p is None else f"p {r.p:.3f}; "
    return f"ρ = {r.rho:+.2f} ({ci}{p}{r.n} heads)".replace("-", "−")


def check_pair(result, metric: str | None, score: str | None) -> tuple[str, str]:
    """The weight metric and the score to draw (defaults: the first related metric, and its usual score), refused
    with InputError naming --metric or --score when the document has no such column."""
    metrics = list(result.settings.metrics)
    metric = metric or (result.settings.relate[0] if result.settings.relate else "symmetry")
    if metric not in metrics:
        raise InputError(f"--metric {metric}: not in this heads document (it has {', '.join(metrics)})")
    have = result.scores
    score = score or DEFAULT_SCORE.get(metric, "previous_token")
    if score not in have:
        raise InputError(f"--score {score}: not in this heads document (it has {', '.join(have)})")
    return metric, score


def heads_figure(result, metric: str | None = None, score: str | None = None, *, canvas: Canvas = new_figure,
                 title: str | None = None) -> Figure:
    """The scatter of `metric` (x) against `score` (y) over every head, coloured by layer."""
    metric, score = check_pair(result, metric, score)
    recs = [r for r in result.records if r.weights.get(metric) is not None and r.scores.get(score) is not None]
    if not recs:
        raise InputError(f"{metric} / {score}: no head has both values")
    x = np.array([r.weights[metric] for r in recs])
    y = np.array([r.scores[score] for r in recs])
    e = np.array([np.nan if r.errors.get(score) is None else r.errors[score] for r in recs])
    layer = np.array([r.layer for r in recs])
    L = result.model.blocks[0].n_layers
    fig = canvas(4.2)
    ax = fig.add_subplot(1, 1, 1)
    ax.errorbar(x, y, yerr=np.where(np.isfinite(e), e, 0), fmt="none", ecolor="0.6", elinewidth=0.6, zorder=1)
    dots = ax.scatter(x, y, c=layer, cmap="viridis", vmin=0, vmax=max(L - 1, 1), s=16, edgecolors="none", zorder=2)
    bar = fig.colorbar(dots, ax=ax, pad=0.01)
    bar.set_label("layer")
    bar.ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(metric)
    ax.set_ylabel(SCORE_NAMES.get(score, score))
    rels = {(r.scope): r for r in result.relations if r.metric == metric and r.score == score and r.layer is None}
    lines = [title or f"{result.model.name}: {metric} against {SCORE_NAMES.get(score, score)}",
             f"all heads: {rho_words(rels.get('all'))}", f"within layers: {rho_words(rels.get('within'))}"]
    suptitle(fig, "\n".join(lines))
    return fig


CAPTION = ("One dot per query head, coloured by its layer; the vertical bar is the score's standard error over "
           "sequences. ρ: Spearman's rank correlation over all heads, and of the ranks within each layer pooled "
           "(depth cannot make that one); 95 % percentile-bootstrap interval over heads; p: permutation p-value. "
           "A correlation across the heads of one model: it says which heads tend to go together, not that the "
           "weights cause the behaviour.")
