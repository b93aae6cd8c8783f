"""The experiment figure, drawn from an experiment's records (`run_experiment`'s result, or the JSON `qkinspect
experiment` writes read back by qkinspect.experiment.saved.read_experiment): Δloss per head as a layer × head heatmap
for each edit, the weight-space prediction against Δloss (with Spearman's rank correlation, the library's:
qkinspect.experiment.results), and the mean Δloss against K for `rank:K` edits (qkinspect.experiment.costs). Only
arranging and drawing runs here."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qkinspect.errors import InputError
from qkinspect.experiment.costs import measured, rank_errors, rank_points, typical_se
from qkinspect.experiment.results import ExperimentResult, Run, spearman
from qkinspect.report.grid import Grid
from qkinspect.report.heatmap import colorbar, diverging_norm_unbounded, draw
from qkinspect.report.style import Canvas, new_figure
from qkinspect.report.titles import fit, suptitle
from qkinspect.rho import rho_text


def _head_runs(result: ExperimentResult, edit: str) -> list[Run]:
    return measured(result, "head", edit)


def dloss_grid(result: ExperimentResult, edit: str) -> Grid:
    """Δloss of the head-scope runs of `edit`, layer × head (NaN where a head was not run exactly), over every layer
    and head the experiment holds a head-scope run of `edit` for: an estimated map's axes stay whole, its heads not
    run exactly grey, never dropped from the axis."""
    every = [r for r in result.runs if r.edit == edit and r.scope == "head"]
    return runs_grid(_head_runs(result, edit), edit, "dloss", layers=sorted({r.layer for r in every}),
                     heads=sorted({r.head for r in every}))


def runs_grid(runs: list[Run], edit: str, field: str, *, layers: list[int] | None = None,
              heads: list[int] | None = None) -> Grid:
    """`field` of head-scope `runs` of `edit`, layer × head (NaN where a head has no run), over `layers` and `heads`
    (default: those the runs hold)."""
    layers = layers if layers is not None else sorted({r.layer for r in runs})  # type: ignore[type-var]
    heads = heads if heads is not None else sorted({r.head for r in runs})  # type: ignore[type-var]
    values = np.full((len(layers), len(heads)), np.nan)  # (n_layers, n_heads)
    for r in runs:
        values[layers.index(r.layer), heads.index(r.head)] = getattr(r, field)  # type: ignore[arg-type]
    return Grid(block="", metric=edit, layers=layers, heads=heads, values=values)


def _edits(result: ExperimentResult) -> list[str]:
    names = list(dict.fromkeys(r.edit for r in result.runs))
    return [e for e in names if _head_runs(result, e)]


def experiment_figure(result: ExperimentResult, canvas: Canvas = new_figure, title: str | None = None):
    """Every edit run of the experiment, under a title naming the model: heatmaps of Δloss per head (one per edit
    run head by head, one colour scale), the weight-space prediction against Δloss, bars of Δloss per edit for
    the runs of whole layers or of the whole model, and Δloss against K for `rank:K` edits. `title` replaces the
    figure's title.

    Raises:
        InputError: the experiment holds no run with a loss.
    """
    edits = _edits(result)
    ranks = rank_points(result)
    panels = _panels(result, edits, ranks)
    if not edits and not panels:
        raise InputError("the experiment holds no run with a loss: nothing to draw")
    cols = min(3, len(edits))  # heatmaps three a row: wide enough for their cells
    rows = -(-len(edits) // cols) if edits else 0
    n_bottom = -(-len(panels) // 2)  # two panels a row
    top_h, bottom_h = 1.9 * rows + 0.7 if edits else 0.0, 2.7 * n_bottom
    fig = canvas(min(9.5, top_h + bottom_h + 0.5))
    if edits and panels:
        top, bottom = fig.subfigures(2, 1, height_ratios=[top_h, bottom_h])
    else:
        top, bottom = (fig, None) if edits else (None, fig)
    if edits:
        _heatmaps(top, result, edits, rows, cols)
    if panels:
        axes = bottom.subplots(n_bottom, min(2, len(panels)), squeeze=False).ravel()
        for ax, draw_panel in zip(axes, panels, strict=False):
            draw_panel(ax)
        for ax in axes[len(panels):]:
            ax.set_visible(False)
    name = Path(str(result.model.name or "")).name  # a file's name, not its whole path
    measure = result.measure_name or "loss"
    suptitle(fig, title or f"{name}: what editing the attention heads costs (Δ {measure}; unedited "
                           f"{result.baseline:.3f})")
    return fig


def _panels(result: ExperimentResult, edits: list[str], ranks: list[tuple[int, float]]) -> list:
    """The panels under the heatmaps, each a function drawing on an Axes."""
    out = []
    if any(r.predicted is not None for e in edits for r in _head_runs(result, e)):
        out.append(lambda ax: _scatter(ax, result, [e for e in edits if e != "ablate"] or edits))
    for scope in ("model", "layer"):
        if measured(result, scope):
            out.append(lambda ax, scope=scope: _bars(ax, result, scope))
    if len(ranks) >= 2:
        out.append(lambda ax: _rank_curve(ax, ranks, rank_errors(result)))
    return out


def _heatmaps(sub, result: ExperimentResult, edits: list[str], rows: int, cols: int) -> None:
    grids = [dloss_grid(result, e) for e in edits]
    norm = diverging_norm_unbounded(*[g.values for g in grids])
    axes = sub.subplots(rows, cols, squeeze=False).ravel()
    for ax, g in zip(axes, grids, strict=False):
        im = draw(ax, g, norm, number=_dnumber)
        ax.set_title(g.metric)
    for ax in axes[len(grids):]:
        ax.set_visible(False)
    colorbar(sub, im, list(axes[: len(grids)]), "Δloss")
    estimated = any(r.dloss_estimate is not None for r in result.runs)
    what = ("each head edited alone: exact Δloss of the verified heads (grey: estimated only, not run exactly; "
            "--kind costmap draws every estimate)" if estimated
            else "each head edited alone: Δloss per head (numbers where they fit their cells)")
    se = typical_se([r for e in edits for r in _head_runs(result, e)])
    if se is not None:
        what += f"; s.e. of each Δloss {se[0]:.2g} (median; largest {se[1]:.2g}): differences within ~2 s.e. are noise"
    suptitle(sub, what, x=0.02, ha="left", fontsize=9)


def _dnumber(x: float) -> str:
    """A Δloss in a cell: 2 significant digits (an edit's Δloss is often far below 3 decimals)."""
    return f"{x:.2g}"


def _edit_order(runs: list[Run]) -> list[str]:
    names = list(dict.fromkeys(r.edit for r in runs))
    return [e for e in names if e != "ablate"] + [e for e in names if e == "ablate"]  # the yardstick last


def _bars(ax, result: ExperimentResult, scope: str) -> None:
    """Δloss per edit of the runs at `scope` ("model": one bar per edit; "layer": a group of bars per layer),
    with ± one standard error where the runs carry one."""
    runs = measured(result, scope)
    edits = _edit_order(runs)
    layers = sorted({r.layer for r in runs}) if scope == "layer" else [None]  # type: ignore[type-var]
    width = 0.8 / len(edits) if scope == "layer" else 0.7
    for k, e in enumerate(edits):
        by_unit = {r.layer: r for r in runs if r.edit == e}
        xs = [i for i, layer in enumerate(layers) if layer in by_unit]
        pts = [by_unit[layers[i]] for i in xs]
        x = np.array(xs, dtype=float) + ((k - (len(edits) - 1) / 2) * width if scope == "layer" else k)
        se = [r.dloss_se for r in pts]
        err = None if any(v is None for v in se) else se
        ax.bar(x, [r.dloss for r in pts], width=width, yerr=err, capsize=2, color=f"C{k % 10}",
               label=e if scope == "layer" else None)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_ylabel("Δloss")
    if scope == "layer":
        ax.set_xticks(range(len(layers)), [str(x) for x in layers])
        ax.set_xlabel("layer index (the edit in every head of the layer)")
        ax.set_title("each layer edited alone")
        lo, hi = ax.get_ylim()
        rows = -(-len(edits) // 4)
        ax.set_ylim(lo, hi + (hi - lo) * 0.18 * rows)  # head room for the legend: it covers no bar
        ax.legend(fontsize="x-small", ncols=min(4, len(edits)), frameon=False, loc="upper center")
    else:
        ax.set_xticks(range(len(edits)), edits, rotation=30 if len(edits) > 4 else 0, ha="right" if len(edits) > 4
                      else "center")
        ax.set_title("all chosen heads edited at once")


def _scatter(ax, result: ExperimentResult, edits: list[str]) -> None:
    for e in edits:
        pts = [(r.predicted, r.dloss) for r in _head_runs(result, e) if r.predicted is not None]
        if not pts:
            continue
        x, y = zip(*pts, strict=True)
        rho = spearman(list(x), list(y))
        label = fit(f"{e}: Spearman {rho_text(rho, len(pts))}", 2.3, 7.5)  # the panel is ~3 in wide
        se = [r.dloss_se for r in _head_runs(result, e) if r.predicted is not None]
        err = None if any(v is None for v in se) else se
        ax.errorbar(x, y, yerr=err, fmt="o", markersize=3, alpha=0.7, elinewidth=0.7, capsize=0, label=label)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("weight-space prediction")
    ax.set_ylabel("Δloss (± one s.e.)")
    estimated = any(r.dloss_estimate is not None for r in result.runs)
    ax.set_title("does the weight metric predict the cost?" + ("\n(verified heads only: chosen to include the "
                                                                "extremes)" if estimated else ""))
    ax.legend(fontsize="small")


def _rank_curve(ax, points: list[tuple[int, float]], errors: list[float | None] | None = None) -> None:
    """Mean Δloss against K, with bars of the mean standard error (a bound on the mean's) where every run has one."""
    k, d = zip(*points, strict=True)
    err = None if errors is None or any(e is None for e in errors) else errors
    ax.errorbar(k, d, yerr=err, marker="o", capsize=2)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("K (rank kept of W_Q W_Kᵀ)")
    ax.set_ylabel("mean Δloss (± mean s.e.)" if err is not None else "mean Δloss")
    ax.set_title("truncating the rank")
