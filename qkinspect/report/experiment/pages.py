"""The report's experiment section (`qkinspect report MODEL --experiment runs.json`): in plain words, what sharing
one matrix for queries and keys (and each other edit) costs the model, which heads could share it almost for free,
and whether the weight metric predicts the cost; then the cheapest and costliest heads as a table. The numbers are
the library's (qkinspect.experiment.costs, from the records qkinspect.experiment.saved reads): only words here."""

from __future__ import annotations

import math
from pathlib import Path

from qkinspect.experiment import costs
from qkinspect.experiment.results import SIGNIFICANT, ExperimentResult
from qkinspect.report.pages import TextPages
from qkinspect.report.style import fmt
from qkinspect.report.tables import Table
from qkinspect.rho import rho_text

LISTED = 8  # heads named in the text, and rows of each table half
SHARE = "share_qk"  # the edit the section's questions are about: one matrix for queries and keys

CAPTION = ("Top: Δloss (the edited model's loss minus the unedited one's) of every head edited alone, one panel per "
           "edit, layers × heads, on one diverging colour scale centred at 0 (red: the edit costs loss). Bottom "
           "left: each head's weight-space prediction against its Δloss, with Spearman's rank correlation ρ (its 95 % "
           "interval, or \"too few to tell\" under 10 heads); bottom "
           "right (when several rank:K edits were run): the mean Δloss against K. Runs that edit a whole layer or "
           "every chosen head at once are bars of Δloss per edit (with ± one standard error where the runs carry "
           "one); a number is written in a heatmap's cells only where every number fits its cell.")


def dfmt(x: float | None) -> str:
    """A loss difference to 3 significant digits: an edit's Δloss is often far below the report's 3 decimals."""
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.3g}"


def _scope_words(c: costs.EditCost) -> str:
    if c.scope == "model":
        return "edited in all the chosen heads at once"
    per = "layer" if c.scope == "layer" else "head"
    return (f"summed over {c.units} runs, one {per} edited at a time (a sum of separate costs, not the cost of "
            "editing them all at once)")


def _cost_line(c: costs.EditCost) -> str:
    ratio = ("" if c.ratio is None or c.edit == "ablate"
             else f"; {fmt(c.ratio)} times what removing the same heads costs")
    return f"{c.edit}: Δloss {dfmt(c.dloss)}, {_scope_words(c)}{ratio}."


def _head(h: costs.HeadCost) -> str:
    return f"L{h.layer}.H{h.head}"


def experiment_section(pages: TextPages, result: ExperimentResult, path: Path) -> None:
    """The section's words: the model-level costs, the heads that share almost for free, and the prediction."""
    tokens = "?" if result.tokens is None else result.tokens
    text = "a text" if result.text is None else result.text
    pages.heading("Experiment: what editing the heads costs")
    pages.paragraph(f"From {path.name}: the loss of the model with its attention weights edited, measured by "
                    f"{result.measure_name or 'the loss'} over {tokens} tokens of {text} "
                    f"(read from the experiment's JSON; the model is not run again).", color="0.25")
    pages.paragraph(f"Baseline (unedited) loss: {fmt(result.baseline)}.")
    pages.heading("What each edit costs the model", size=10.5)
    for e in costs.edits(result):
        if (c := costs.edit_cost(result, e)) is not None:
            pages.paragraph(_cost_line(c))
    heads = costs.head_costs(result, SHARE)
    if heads:
        _share_words(pages, heads)
    preds = [p for e in costs.edits(result) if e != "ablate" and (p := costs.prediction(result, e)) is not None]
    if preds:
        pages.heading("Does the weight metric predict the cost?", size=10.5)
        for p in preds:
            pages.paragraph(f"{p.edit}: Spearman's rank correlation between {p.predictor} and Δloss "
                            f"{rho_text(p.rho, p.n)}, p = {p.p:.2g}: {meaning(p)}.")


def _pm(h: costs.HeadCost) -> str:
    return dfmt(h.dloss) + ("" if h.se is None else f" ± {dfmt(h.se)}")


def _share_words(pages: TextPages, heads: list[costs.HeadCost]) -> None:
    pages.heading("Which heads could share one matrix for queries and keys almost for free?", size=10.5)
    free = costs.free_heads(heads)
    if all(h.se is None for h in heads):
        pages.paragraph("These runs carry no standard errors (written by an older qkinspect), so no head is "
                        "called free or costly; the smallest and largest are:")
    elif any(h.ratio is not None for h in heads):
        names = ", ".join(f"{_head(h)} (Δloss {_pm(h)})" for h in free[:LISTED])
        more = f" and {len(free) - LISTED} more" if len(free) > LISTED else ""
        pages.paragraph(f"{len(free)} of {len(heads)} heads: share_qk costs them at most "
                        f"{costs.FREE_RATIO:g} of what removing the head costs, beyond the error of both (ablating "
                        f"costs more than {SIGNIFICANT:g} standard errors, and share_qk's Δloss plus "
                        f"{SIGNIFICANT:g} standard errors stays within {costs.FREE_RATIO:g} of it)"
                        f"{': ' + names + more if free else ''}.")
    else:
        pages.paragraph("No ablation of the same heads costs loss beyond its error (or the runs were made with "
                        "--no-reference), so nothing says which costs are small against removing a head; the "
                        "smallest are:")
    cheap = ", ".join(f"{_head(h)} ({_pm(h)})" for h in heads[:LISTED])
    costly = costs.costly_heads(heads)
    if all(h.se is None for h in heads):
        largest = f"Largest: {_head(heads[-1])} ({_pm(heads[-1])})."
    elif costly:
        largest = (f"Largest beyond its error: {_head(costly[0])} ({_pm(costly[0])}); {len(costly)} of {len(heads)} "
                   f"heads cost loss beyond {SIGNIFICANT:g} standard errors.")
    else:
        largest = f"No head's share_qk Δloss exceeds {SIGNIFICANT:g} standard errors."
    pages.paragraph(f"Smallest share_qk Δloss: {cheap}. {largest}")


def head_table(result: ExperimentResult, edit: str = SHARE) -> Table | None:
    """The cheapest and the costliest heads of `edit` (head-scope runs), one row each."""
    heads = costs.head_costs(result, edit)
    if not heads:
        return None
    shown = heads if len(heads) <= 2 * LISTED else heads[:LISTED] + heads[-LISTED:]
    rows = [[_head(h), dfmt(h.dloss), dfmt(h.se), fmt(h.ratio), fmt(h.predicted)] for h in shown]
    if len(shown) < len(heads):
        rows.insert(LISTED, ["…", "", "", "", ""])
    title = (f"{edit}: the {LISTED} cheapest and the {LISTED} costliest of {len(heads)} heads, by Δloss"
             if len(shown) < len(heads) else f"{edit}: all {len(heads)} heads, cheapest first")
    return Table(title, ["head", "Δloss", "± s.e.", "ratio to ablate", "predicted"], rows)


def meaning(p: costs.Prediction) -> str:
    """What ρ and p say, in words (over fewer than qkinspect.rho.MIN_HEADS heads: that they are too few to tell)."""
    from qkinspect.rho import MIN_HEADS

    if p.n < MIN_HEADS:
        return (f"{p.n} heads are too few to tell whether {p.predictor} orders the heads by what {p.edit} costs "
                f"them (qkinspect reads ρ from {MIN_HEADS} heads on)")
    if p.p >= 0.05:
        return (f"no evidence that {p.predictor} orders the heads by what {p.edit} costs them: a ρ this far from "
                f"0 comes out by chance with probability {p.p:.2g} over {p.n} heads")
    if p.rho > 0:
        strength = "closely" if p.rho >= 0.7 else "partly" if p.rho >= 0.4 else "weakly"
        return (f"{p.predictor} {strength} predicts the cost: heads it puts further from the edit lose more loss "
                f"when edited (unlikely by chance, p = {p.p:.2g})")
    return (f"the opposite of a prediction: heads {p.predictor} puts further from the edit lose less loss "
            f"(p = {p.p:.2g})")
