"""The experiment figure, drawn from the JSON that `qkinspect experiment` writes: Δloss per head as a layer × head
heatmap for each edit, the weight-space prediction against Δloss (with Spearman's rank correlation), and Δloss
against K for `rank:K` edits. Only reading and arranging runs here (DESIGN.md §1)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from qkinspect.errors import InputError
from qkinspect.report.grid import Grid
from qkinspect.report.heatmap import colorbar, diverging_norm_unbounded, draw
from qkinspect.report.style import Canvas, new_figure
from qkinspect.report.titles import suptitle


def read_experiment(path: Path) -> dict[str, Any]:
    """The document `qkinspect experiment -o FILE.json` wrote, checked whole (report.runs_check); InputError (one
    line naming the file and the key) for anything else."""
    from qkinspect.reading import read_json
    from qkinspect.report.runs_check import check_experiment

    return check_experiment(read_json(path, what="an experiment document"), path)


def _head_runs(doc: dict[str, Any], edit: str) -> list[dict[str, Any]]:
    return [r for r in doc["runs"] if r["edit"] == edit and r["scope"] == "head" and r.get("dloss") is not None]


def dloss_grid(doc: dict[str, Any], edit: str) -> Grid:
    """Δloss of the head-scope runs of `edit`, layer × head (NaN where a head was not run)."""
    runs = _head_runs(doc, edit)
    layers = sorted({r["layer"] for r in runs})
    heads = sorted({r["head"] for r in runs})
    values = np.full((len(layers), len(heads)), np.nan)  # (n_layers, n_heads)
    for r in runs:
        values[layers.index(r["layer"]), heads.index(r["head"])] = r["dloss"]
    return Grid(block="", metric=edit, layers=layers, heads=heads, values=values)


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation (NaN with fewer than 3 points or a constant side)."""
    from scipy.stats import spearmanr

    if len(x) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return math.nan
    return float(spearmanr(x, y).statistic)


def _edits(doc: dict[str, Any]) -> list[str]:
    names = list(dict.fromkeys(r["edit"] for r in doc["runs"]))
    return [e for e in names if _head_runs(doc, e)]


def experiment_figure(doc: dict[str, Any], canvas: Canvas = new_figure, title: str | None = None):
    """Heatmaps of Δloss per head (one per edit, one colour scale), then prediction vs Δloss and Δloss vs K;
    `title` replaces the figure's title."""
    edits = _edits(doc)
    ranks = _rank_points(doc)
    if not edits and len(ranks) < 2:
        raise InputError("the experiment has no head-scope runs and fewer than two rank:K edits: nothing to draw "
                         "(run it with --scope head, or with several rank:K)")
    fig = canvas(6.5 if edits else 3.0)
    top, bottom = fig.subfigures(2, 1, height_ratios=[1.3, 1]) if edits else (None, fig)
    if edits:
        grids = [dloss_grid(doc, e) for e in edits]
        norm = diverging_norm_unbounded(*[g.values for g in grids])
        axes = top.subplots(1, len(grids), squeeze=False)[0]
        for ax, g in zip(axes, grids, strict=True):
            im = draw(ax, g, norm)
            ax.set_title(g.metric)
        colorbar(top, im, list(axes), "Δloss")
        name = Path(str(doc.get("model", {}).get("name", ""))).name  # a file's name, not its whole path
        suptitle(top, title or f"{name}: Δ{doc['measure']['name']} per head (baseline {doc['baseline']:.3f})")
    panels = bottom.subplots(1, 2 if len(ranks) >= 2 and edits else 1, squeeze=False)[0]
    if edits:
        _scatter(panels[0], doc, [e for e in edits if e != "ablate"] or edits)
    if len(ranks) >= 2:
        _rank_curve(panels[-1], ranks)
    return fig


def _scatter(ax, doc: dict[str, Any], edits: list[str]) -> None:
    for e in edits:
        pts = [(r["predicted"], r["dloss"]) for r in _head_runs(doc, e) if r.get("predicted") is not None]
        if not pts:
            continue
        x, y = zip(*pts, strict=True)
        rho = spearman(list(x), list(y))
        ax.scatter(x, y, s=10, alpha=0.7, label=f"{e} (Spearman ρ = {rho:.2f})")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("weight-space prediction")
    ax.set_ylabel("Δloss")
    ax.set_title("does the weight metric predict the cost?")
    ax.legend(fontsize="small")


def _rank_points(doc: dict[str, Any]) -> list[tuple[int, float]]:
    """(K, Δloss) per rank:K edit, averaged over its runs (of any one scope)."""
    by_k: dict[int, list[float]] = {}
    for r in doc["runs"]:
        if r["edit"].startswith("rank:") and r.get("dloss") is not None:
            by_k.setdefault(int(r["edit"].split(":")[1]), []).append(r["dloss"])
    return sorted((k, float(np.mean(v))) for k, v in by_k.items())


def _rank_curve(ax, points: list[tuple[int, float]]) -> None:
    k, d = zip(*points, strict=True)
    ax.plot(k, d, marker="o")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("K (rank kept of W_Q W_Kᵀ)")
    ax.set_ylabel("mean Δloss")
    ax.set_title("truncating the rank")
