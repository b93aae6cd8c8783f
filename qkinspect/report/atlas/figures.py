"""The atlas's figures, drawn from its records (qkinspect.atlas.read_atlas); nothing is computed here.

- `depth_figure`: a metric against normalised depth l / (L − 1), one panel per block kind (encoder self-attention,
  decoder self-attention, cross-attention), a line per model and block through its per-layer medians over heads
  with the quartile band around it; line style tells the kinds apart as well (encoder dashed, decoder solid,
  cross dotted). A block of one layer is a point at depth 0.5 with its quartile bar.
- `size_figure`: each model's median of a metric (over heads; for the layer form over layers) against its
  attention parameter count (log axis), quartile bars; marker shape by block kind.

The PDF report is `qkinspect.report.atlas.pdf`, the HTML one `qkinspect.report.atlas.html`.

A model keeps its colour in every figure; with many models the legend goes beside the panels in columns and the
bands fade, so 40 models stay readable.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from qkinspect.atlas.results import AtlasRecord
from qkinspect.errors import InputError
from qkinspect.report.style import Canvas, colours, new_figure, style
from qkinspect.report.titles import suptitle

KINDS = ("encoder", "decoder", "cross")
KIND_TITLES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention", "cross": "cross-attention"}
LINESTYLES = {"encoder": "--", "decoder": "-", "cross": ":"}
MARKERS = {"encoder": "o", "decoder": "s", "cross": "^"}
JITTER = {"encoder": 10 ** -0.01, "decoder": 1.0, "cross": 10 ** 0.01}  # ±2% in x, so bars do not overlap
# Drawn by the report when the atlas has them, in this order.
REPORT_METRICS = ("symmetry", "symmetry_layer", "directionality", "overlap_qk", "overlap_qv", "overlap_kv",
                  "qk_effective_rank", "shared_qk_distance")
SIZE_METRICS = ("symmetry_layer", "symmetry", "overlap_qk")
LAYER_FORM = ("symmetry_layer", "directionality_layer")
LEGEND_NAME = 36  # characters of a model's name in a legend (models are named as `info` names them: short)
LAYER_FORM_MATH = r"the layer form $\Sigma_hW_Q^{h}W_K^{g(h)\top}$"  # mathtext: no spaces (titles wrap at them)


def _check_metric(atlas, metric: str) -> None:
    if not atlas.records:
        raise InputError(f"{atlas.folder}: the atlas has no results yet")
    if metric not in atlas.metrics:
        raise InputError(f"--metric {metric}: the atlas does not hold it; it has {', '.join(atlas.metrics)}")


def _kind_of(atlas) -> dict[tuple[str, str], str]:
    return {(f["model"], f["block"]): f["kind"] for f in atlas.facts}


TOWER_MARKERS = ("o", "s", "^", "D", "v")


def _towers(kind_of: dict[tuple[str, str], str], keys) -> dict[tuple[str, str], str]:
    """(model, block) -> a marker for the blocks of a model that has several of one kind (CLIP's text and vision
    encoders), so that its lines in one panel are told apart; the first of each kind has none."""
    seen: dict[tuple[str, str], int] = {}
    out = {}
    for model, block in keys:
        k = (model, kind_of.get((model, block), ""))
        seen[k] = seen.get(k, 0) + 1
        if seen[k] > 1:
            out[(model, block)] = TOWER_MARKERS[(seen[k] - 2) % len(TOWER_MARKERS)]
    return out


def _short(name: str) -> str:
    return name if len(name) <= LEGEND_NAME else "…" + name[-(LEGEND_NAME - 1):]


def chance_levels(atlas, metric: str) -> dict[tuple[str, str], float]:
    """(model, block) -> the chance level of `metric` (its random baseline) where the records have one."""
    return {(r.model, r.block): r.chance for r in atlas.records
            if r.metric == metric and r.scope == "model" and r.chance is not None}


def _legend(fig, atlas, palette: dict[str, Any], kinds: Sequence[str], *, markers: bool,
            towers: dict[tuple[str, str], str] | None = None, chance: bool = False) -> None:
    """Models by colour, block kinds by line style (or marker), beside the panels; columns as the count needs.
    `towers`: a model's further blocks of one kind, by marker (an entry each); `chance`: an entry for the chance
    levels (thin dotted lines, or ticks, in the model's colour)."""
    models = [m for m in atlas.models if m in palette]
    handles = [Line2D([], [], color=palette[m], linewidth=2) for m in models]
    labels = [_short(m) for m in models]
    for (model, block), marker in (towers or {}).items():
        handles.append(Line2D([], [], color=palette[model], linewidth=1, marker=marker, markersize=3))
        labels.append(_short(f"{model} [{block}]"))
    if len(kinds) > 1 or markers:
        for k in kinds:
            handles.append(Line2D([], [], color="0.2", linestyle="none" if markers else LINESTYLES[k],
                                  marker=MARKERS[k] if markers else None))
            labels.append(KIND_TITLES[k])
    if chance:
        handles.append(Line2D([], [], color="0.2", linestyle="none" if markers else (0, (1, 2)), linewidth=0.8,
                              marker="_" if markers else None, markersize=9))
        labels.append("chance level (random weights of the model's shapes)")
    n = len(handles)
    size = 8 if n <= 16 else 7  # the model report's legends are 8 pt; never below 7 (40 models read at 7)
    ncol = 1 if n <= 26 else 2 if n <= 60 else 3
    fig.legend(handles, labels, loc="outside right center", frameon=False, fontsize=size, ncol=ncol,
               handlelength=2.2, borderaxespad=0.2)
    if fig.figure is fig and fig.get_layout_engine() is not None:  # a figure of its own (not a report page's part):
        # 0.1 in between panels and legend, which the default pad left touching the panels at 200 dpi (40 models)
        fig.get_layout_engine().set(w_pad=0.1)


def _width(n_models: int) -> float:
    return 7.0 if n_models <= 24 else 9.0


def depth_figure(atlas, metric: str = "symmetry", *, canvas: Canvas = new_figure, name: str | None = None) -> Figure:
    """`metric` against normalised depth: a line per model and block through its per-layer medians (over heads),
    its quartile band around it; one panel per block kind. InputError when the atlas does not hold `metric`."""
    _check_metric(atlas, metric)
    rows = [r for r in atlas.records if r.metric == metric and r.scope == "layer"]
    kind_of = _kind_of(atlas)
    lines: dict[tuple[str, str], list[AtlasRecord]] = {}
    for r in rows:
        lines.setdefault((r.model, r.block), []).append(r)
    kinds = [k for k in KINDS if any(kind_of.get(key) == k for key in lines)]
    drawn = [m for m in atlas.models if any(key[0] == m for key in lines)]
    palette = dict(zip(drawn, colours(len(drawn)), strict=True))
    band = max(0.05, 0.22 / math.sqrt(max(1, len(drawn))))
    towers = _towers(kind_of, lines)
    layer_form = metric in LAYER_FORM
    chance = chance_levels(atlas, metric)
    with style():
        fig = canvas(0.9 + 2.5 * len(kinds), _width(len(drawn)))
        axes = fig.subplots(len(kinds), 1, squeeze=False, sharex=True, sharey=True)[:, 0]
        for ax, kind in zip(axes, kinds, strict=True):
            n = 0
            for (model, block), points in lines.items():
                if kind_of.get((model, block)) != kind:
                    continue
                n += 1
                points = sorted(points, key=lambda p: p.depth)
                x = np.array([p.depth for p in points])
                med = np.array([p.median for p in points])
                q1 = np.array([p.q1 for p in points])
                q3 = np.array([p.q3 for p in points])
                c = palette[model]
                if (model, block) in chance:
                    ax.axhline(chance[(model, block)], color=c, linestyle=(0, (1, 2)), linewidth=0.8, alpha=0.9)
                if len(points) == 1:
                    ax.errorbar(x, med, yerr=[med - q1, q3 - med], color=c, marker="o", markersize=3, capsize=2)
                    continue
                marker = towers.get((model, block))
                ax.plot(x, med, color=c, linestyle=LINESTYLES[kind], linewidth=1.3, marker=marker, markersize=3)
                if not layer_form:
                    ax.fill_between(x, q1, q3, color=c, alpha=band, linewidth=0)
            ax.set_title(f"{KIND_TITLES[kind]} ({n} {'model' if n == 1 else 'models'})", loc="left")
            ax.set_ylabel(metric)
            ax.grid(True, axis="y")
            ax.set_xlim(-0.02, 1.02)
        axes[-1].set_xlabel("normalised depth l / (L − 1)   (0: first layer, 1: last)")
        _legend(fig, atlas, palette, kinds, markers=False, towers=towers, chance=bool(chance))
        what = (LAYER_FORM_MATH + " per layer, query head h with key head g(h) = h // (heads / kv heads)"
                if layer_form else "median over each layer's heads (line), quartiles (band)")
        if chance:
            what += "; dotted: each model's chance level"
        suptitle(fig, f"{name or atlas.folder}: {metric} against depth\n{what}")
    return fig


def size_figure(atlas, metric: str = "symmetry_layer", *, canvas: Canvas = new_figure,
                name: str | None = None) -> Figure:
    """Each model's (and block's) median of `metric` against its attention parameters, log x, quartile bars."""
    _check_metric(atlas, metric)
    kind_of = _kind_of(atlas)
    params: dict[str, int] = {}
    for f in atlas.facts:
        params[f["model"]] = params.get(f["model"], 0) + f["attention_params"]
    rows = [r for r in atlas.records if r.metric == metric and r.scope == "model"]
    drawn = [m for m in atlas.models if any(r.model == m for r in rows)]
    palette = dict(zip(drawn, colours(len(drawn)), strict=True))
    kinds = [k for k in KINDS if any(kind_of.get((r.model, r.block)) == k for r in rows)]
    over = "layers" if metric in LAYER_FORM else "heads"
    chance = chance_levels(atlas, metric)
    with style():
        fig = canvas(4.2, _width(len(drawn)))
        ax = fig.subplots()
        for r in rows:
            kind = kind_of.get((r.model, r.block), "encoder")
            x = params[r.model] * JITTER[kind]  # a model's blocks side by side, not on top of each other
            ax.errorbar([x], [r.median], yerr=[[r.median - r.q1], [r.q3 - r.median]],
                        color=palette[r.model], marker=MARKERS[kind], markersize=5, capsize=2, linewidth=1)
            if (r.model, r.block) in chance:
                ax.plot([x], [chance[(r.model, r.block)]], color=palette[r.model], marker="_",
                        markersize=9, linestyle="none")
        ax.set_xscale("log")
        ax.set_xlabel("attention parameters (W_Q, W_K, W_V, W_O of every block), log scale")
        ax.set_ylabel(f"{metric} (median over {over})")
        ax.grid(True, axis="y")
        _legend(fig, atlas, palette, kinds, markers=True, chance=bool(chance))
        suptitle(fig, f"{name or atlas.folder}: {metric} against model size\nmedian over {over} (marker), "
                      "quartiles (bar)" + ("; chance level (tick)" if chance else ""))
    return fig
