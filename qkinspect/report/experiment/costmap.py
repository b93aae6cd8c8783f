"""The cost map (`qkinspect plot --kind costmap`), drawn from the records of `qkinspect experiment --estimate` (its
JSON read back by qkinspect.experiment.saved): each edit's estimated Δloss per head as a layer × head heatmap, the
heads run exactly to check it marked, and the rank agreement between estimate and exact runs (the estimate's
`Agreement`) in the panel's title; the report's pages on it. Only arranging and drawing runs here."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qkinspect.errors import InputError
from qkinspect.experiment.results import RHO_HEADS, Agreement, ExperimentResult, Run
from qkinspect.report.experiment.figure import runs_grid
from qkinspect.report.grid import Grid
from qkinspect.report.heatmap import colorbar, draw
from qkinspect.report.style import Canvas, new_figure
from qkinspect.report.titles import canvas_width, fit, suptitle
from qkinspect.rho import rho_text

TITLE_LINES = 5  # a panel title's lines at most


def estimated_edits(result: ExperimentResult) -> list[str]:
    """The edits with head-scope estimates, in the order they ran."""
    return list(dict.fromkeys(r.edit for r in result.runs if r.scope == "head" and r.dloss_estimate is not None))


def _runs(result: ExperimentResult, edit: str) -> list[Run]:
    return [r for r in result.runs if r.edit == edit and r.scope == "head" and r.dloss_estimate is not None]


def estimate_grid(result: ExperimentResult, edit: str) -> Grid:
    """The estimated Δloss of `edit`, layer × head (NaN where a head was not estimated)."""
    return runs_grid(_runs(result, edit), edit, "dloss_estimate")


def agreement(result: ExperimentResult, edit: str) -> Agreement | None:
    """How the estimate of `edit` agreed with its exact runs; None where the result does not say."""
    for a in result.estimate.agreement if result.estimate is not None else ():
        if a.edit == edit:
            return a
    return None


def panel_title(result: ExperimentResult, edit: str) -> str:
    """The edit, and Spearman's ρ between estimate and exact Δloss with its number of verified heads and interval
    (qkinspect.rho), or that the estimate was not checked."""
    a = agreement(result, edit)
    if a is None or not a.verified:
        return f"{edit}\nnot checked against exact runs"
    if a.verified < RHO_HEADS:  # asked for (--verify 1 or 2): say why there is no ρ
        heads = f"{a.verified} verified head{'s' if a.verified != 1 else ''}"
        return f"{edit}\nestimate vs exact: {heads}; ρ needs {RHO_HEADS}"
    return f"{edit}\nestimate vs exact: {rho_text(a.rho, a.verified, 'verified heads')}"


def _norm(values: np.ndarray):
    """Centred at 0, half-width the largest |value| (estimates span orders of magnitude between edits)."""
    from matplotlib.colors import TwoSlopeNorm

    finite = np.abs(values[np.isfinite(values)])
    lim = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    return TwoSlopeNorm(vcenter=0.0, vmin=-lim, vmax=lim)


def costmap_figure(result: ExperimentResult, canvas: Canvas = new_figure, title: str | None = None):
    """One heatmap per edit (its own diverging colour scale, centred at 0): estimated Δloss per head; circles mark
    the heads run exactly, crosses the estimates flagged unreliable. `title` replaces the model's name."""
    edits = estimated_edits(result)
    if not edits:
        raise InputError("the experiment holds no estimates: run `qkinspect experiment --estimate -o FILE.json` "
                         "(for exact runs, draw --kind experiment)")
    grids = [estimate_grid(result, e) for e in edits]
    n_layers = max(len(g.layers) for g in grids)
    fig = canvas(min(9.0, 2.2 + 0.16 * n_layers))
    axes = fig.subplots(1, len(grids), squeeze=False)[0]
    panel_width = max(1.2, canvas_width(fig) / len(grids) - 0.9)  # inches a panel's title may take
    for ax, g in zip(axes, grids, strict=True):
        im = draw(ax, g, _norm(g.values), annotate=False)
        verified = [(g.heads.index(r.head), g.layers.index(r.layer)) for r in _runs(result, g.metric)
                    if r.dloss is not None]
        flagged = [(g.heads.index(r.head), g.layers.index(r.layer)) for r in _runs(result, g.metric)
                   if r.unreliable]
        if verified:
            ax.scatter(*zip(*verified, strict=True), s=22, facecolors="none", edgecolors="black", linewidths=0.9,
                       label="run exactly")
        if flagged:
            ax.scatter(*zip(*flagged, strict=True), s=16, marker="x", color="black", linewidths=0.8,
                       label="estimate unreliable")
        # wrapped whole: the longest, "ρ = 0.43 (95 % CI 0.02 to 0.72; 24 verified heads)", takes 4 lines of a
        # narrow panel, where 3 cut it to "estimate…"
        ax.set_title(fit(panel_title(result, g.metric), panel_width, 8, max_lines=TITLE_LINES), fontsize=8)
        colorbar(fig, im, [ax], "estimated Δloss")
    handles = [h for ax in axes for h in ax.get_legend_handles_labels()[0]]
    labels = [lab for ax in axes for lab in ax.get_legend_handles_labels()[1]]
    unique = dict(zip(labels, handles, strict=True))
    if unique:
        fig.legend(unique.values(), unique.keys(), loc="outside lower center", ncols=len(unique),
                   fontsize="small", frameon=False)
    name = Path(str(result.model.name or "")).name
    probes = result.estimate.probes if result.estimate is not None else None
    suptitle(fig, f"{title or name}: estimated Δloss per head edited alone\n{result.measure_name or 'loss'}, "
             f"{_or(result.scored, '?')} scored tokens, K = {probes} probes, baseline {result.baseline:.3f}",
             fontsize="medium")
    return fig


LISTED = 8

CAPTION = ("The cost map: each edit's estimated Δloss (the edited model's loss minus the unedited one's) for every "
           "head edited alone, layers × heads, each edit on its own diverging colour scale centred at 0 (red: the "
           "edit costs loss). Circles: heads run exactly to check the estimate; crosses: estimates flagged "
           "unreliable (an exact run on part of the text, made where the edit moves the residual stream far, found "
           "the cost far above the estimate). The title gives Spearman's "
           "rank correlation ρ between estimate and exact Δloss over the verified heads (chosen to include the "
           "predicted extremes, which flatters ρ), with its 95 % interval, or \"too few to tell\" under 10 heads.")

# Under the estimate tables: what their columns and empty cells mean.
TABLE_LEGEND = ("estimate: the estimated Δloss (first-order term plus Monte-Carlo curvature term). MC error: the "
                "Monte-Carlo standard error of the curvature term alone, from the K probes; it is not the "
                "estimate's error, which the exact runs and ρ measure. exact, ± s.e.: the exact run's Δloss and its "
                "standard error over the scored tokens. n/a: the head was not run exactly. flagged: an exact run on "
                "part of the text, made where the edit moves the residual stream far, found the cost far above "
                "the estimate.")


def _d(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def _name(r: Run) -> str:
    return f"L{r.layer}.H{r.head}"


def _or(x: object, missing: str) -> object:
    """`x`, or what the text says where the document did not record it."""
    return missing if x is None else x


def estimate_section(pages, result: ExperimentResult, path: Path) -> None:
    """The report's experiment section for an estimated map: how it was checked, and per edit the heads it
    predicts cheapest and costliest."""
    probes = result.estimate.probes if result.estimate is not None else None
    pages.heading("Experiment: what editing each head would cost (estimated)")
    pages.paragraph(f"From {path.name}: every head's Δloss for each edit, estimated from one clean pass and "
                    f"{_or(probes, '?')} backward passes with labels sampled from the model (first-order term "
                    f"plus a Monte-Carlo Gauss-Newton curvature term), measured by "
                    f"{result.measure_name or 'the loss'} over {_or(result.scored, '?')} scored tokens of "
                    f"{_or(result.text, 'a text')}. Each estimate is for one "
                    "head edited alone; editing many heads at once needs its own exact run (--scope layer or "
                    "model).", color="0.25")
    pages.paragraph(f"Baseline (unedited) loss: {result.baseline:.3f}.")
    for e in estimated_edits(result):
        runs = _runs(result, e)
        a = agreement(result, e)
        flagged = sum(bool(r.unreliable) for r in runs)
        pages.heading(e, size=10.5)
        if a is None or not a.verified:
            check = "The estimate was not checked against exact runs (--verify 0): read it as a guess."
        else:
            rand = rho_text(a.rho_sampled, a.sampled)
            sampled = f"; over the {a.sampled} drawn at random alone, {rand}" if a.sampled else ""
            check = (f"Checked by {a.verified} exact runs (the predicted cheapest and costliest, flagged heads and "
                     "a random sample; the extremes flatter ρ): Spearman's rank correlation between estimate and "
                     f"exact Δloss {rho_text(a.rho, a.verified)}{sampled}.")
            if a.verified < RHO_HEADS:
                check += f" ρ needs at least {RHO_HEADS} verified heads: verify {RHO_HEADS} or more (--verify)."
        pages.paragraph(check + (f" {flagged} of {len(runs)} estimates are flagged unreliable." if flagged else ""))
        if words := extremes_words(sorted((r for r in runs if not r.unreliable),
                                          key=lambda r: (r.dloss_estimate, r.layer, r.head))):
            pages.paragraph(words)


NAMED = 5  # heads named at most at each end in the text


def named_each(n: int) -> int:
    """How many heads the text names at each end of n, cheapest and costliest: short lists that never share a head
    (a quarter of them at most, at least 1 from 2 heads on, at most NAMED)."""
    return 0 if n < 2 else min(NAMED, max(1, n // 4))


def extremes_words(ok: list[Run]) -> str:
    """The predicted cheapest and costliest of the estimated runs `ok` (cheapest first), in two disjoint lists."""
    if not ok:
        return ""
    if len(ok) == 1:
        return f"One head estimated reliably: {_name(ok[0])} ({_d(ok[0].dloss_estimate)})."
    k = named_each(len(ok))
    cheap = ", ".join(f"{_name(r)} ({_d(r.dloss_estimate)})" for r in ok[:k])
    dear = ", ".join(f"{_name(r)} ({_d(r.dloss_estimate)})" for r in ok[::-1][:k])
    return (f"Predicted cheapest {k} of {len(ok)} reliably estimated heads: {cheap}. Predicted costliest {k}: {dear}."
            + (" The table below lists every head." if len(ok) <= 2 * LISTED else ""))


def estimate_table(result: ExperimentResult, edit: str):
    """The predicted cheapest and costliest heads of `edit`: the estimate and the Monte-Carlo error of its curvature
    term, the exact Δloss ± its standard error where run (TABLE_LEGEND says what each column holds)."""
    from qkinspect.report.tables import Table

    runs = sorted(_runs(result, edit), key=lambda r: (r.dloss_estimate, r.layer, r.head))
    if not runs:
        return None
    shown = runs if len(runs) <= 2 * LISTED else runs[:LISTED] + runs[-LISTED:]
    rows = [[_name(r), _d(r.dloss_estimate), _d(r.dloss_estimate_se), _d(r.dloss), _d(r.dloss_se),
             "yes" if r.unreliable else ""] for r in shown]
    if len(shown) < len(runs):
        rows.insert(LISTED, ["…", "", "", "", "", ""])
    title = (f"{edit}: the {LISTED} predicted cheapest and costliest of {len(runs)} heads" if len(shown) < len(runs)
             else f"{edit}: all {len(runs)} heads, by estimate")
    return Table(title, ["head", "estimate", "MC error (curvature term)", "exact", "± s.e.", "flagged"], rows)
