"""The trajectory figure: one per-head metric against the training step, from a sweep's tidy rows.

One panel per block; per layer a line through the median over its heads (colour = layer), each head a faint line of
the same colour behind it, and the block's random baseline (mean ± 3 sd) as a grey band where the sweep has one.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import BoundaryNorm
from matplotlib.figure import Figure

from qkinspect.errors import InputError
from qkinspect.report.style import HEADS_CMAP, Canvas, new_figure, style
from qkinspect.report.titles import suptitle

Rows = Sequence[Mapping[str, Any]]


def trajectory(rows: Rows, metric: str, *, name: str, x_label: str = "training step",
               baselines: Mapping[str, tuple[float, float]] | None = None, canvas: Canvas = new_figure) -> Figure:
    """Draw `metric` against step for every (block, layer, head) in `rows` (the sweep's head rows).

    Args:
        rows: dicts with checkpoint, step, block, layer, head and the metric.
        name: what the sweep covers, for the title.
        baselines: block -> (mean, sd) of the metric for Gaussian weights of the same shapes.

    Raises:
        InputError: no rows, or the metric is not among their columns.

    Example:
        >>> fig = trajectory(read_sweep(folder).rows(), "symmetry", name="pythia-160m")  # doctest: +SKIP
    """
    if not rows:
        raise InputError("the sweep has no results to draw")
    if metric not in rows[0]:
        have = [k for k in rows[0] if k not in ("checkpoint", "step", "block", "layer", "head", "kv_head")]
        raise InputError(f"--metric {metric}: the sweep did not compute it; it has {', '.join(have)}")
    blocks = _by_block(rows, metric)
    n_layers = max(len(layers) for layers in blocks.values())
    with style():
        fig = canvas(0.4 + 2.6 * len(blocks))
        axes = fig.subplots(len(blocks), 1, squeeze=False, sharex=True)[:, 0]
        cmap = colormaps[HEADS_CMAP]
        norm = BoundaryNorm(np.arange(n_layers + 1) - 0.5, cmap.N)
        for ax, (block, layers) in zip(axes, blocks.items(), strict=True):
            _panel(ax, block, layers, cmap, norm, (baselines or {}).get(block))
            ax.set_ylabel(metric)
        axes[-1].set_xlabel(x_label)
        bar = fig.colorbar(_mappable(cmap, norm), ax=list(axes), label="layer", aspect=30)
        bar.set_ticks(range(0, n_layers, max(1, math.ceil(n_layers / 12))))
        suptitle(fig, f"{name}\n{metric}: median over each layer's heads (lines), each head (faint)")
    return fig


def sweep_trajectory(sweep, metric: str, *, layers: Sequence[int] | None = None,
                     blocks: Sequence[str] | None = None, canvas: Canvas = new_figure,
                     name: str | None = None, title: str | None = None) -> Figure:
    """`trajectory` of a sweep folder (qkinspect.sweep.read_sweep), restricted to `layers` and `blocks`, with the
    random baseline its results carry and the step axis named for where the steps came from; `name` (default: the
    folder and its number of checkpoints) heads the title, `title` replaces it (the q/k-norm caveat of a metric of
    W_Q or W_K measured raw stays under either)."""
    rows = [r for r in sweep.rows() if (layers is None or r["layer"] in layers)
            and (blocks is None or r["block"] in blocks)]
    last = next((sweep.results[c.identity] for c in reversed(sweep.checkpoints) if c.identity in sweep.results), {})
    baselines = {b["block"]: (b["mean"], b["std"]) for b in last.get("result", {}).get("baselines", [])
                 if b["metric"] == metric and b["mean"] is not None and b["std"] is not None}
    ordered = {c.step_source for c in sweep.checkpoints} == {"order"}
    name = name or f"{sweep.folder} ({len(sweep.results)} checkpoints)"
    fig = trajectory(rows, metric, name=name, baselines=baselines,
                     x_label="checkpoint (in the order given)" if ordered else "training step", canvas=canvas)
    from qkinspect.report.analysis.figures import shows_raw_qk, with_caveat
    from qkinspect.report.analysis.summary import qk_norm_caveat_of
    from qkinspect.report.titles import retitle

    fig = retitle(fig, title)

    raw = [b for b in raw_qk_norm_blocks_of(sweep) if blocks is None or b in blocks]
    return with_caveat(fig, qk_norm_caveat_of(raw, short=True) if shows_raw_qk("metric", metric) else "")


def raw_qk_norm_blocks_of(sweep) -> list[str]:
    """The blocks any of the sweep's results measured with q/k norms whose gains were not folded in."""
    seen: dict[str, None] = {}
    for doc in sweep.results.values():
        for b in ((doc.get("result") or {}).get("processing") or {}).get("qk_norm_not_folded") or []:
            seen[str(b)] = None
    return list(seen)


def _by_block(rows: Rows, metric: str) -> dict[str, dict[int, dict[int, list[tuple[int, float]]]]]:
    """block -> layer -> head -> [(step, value)] in step order; missing values as NaN."""
    out: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in rows:
        v = r.get(metric)
        out[r["block"]][r["layer"]][r["head"]].append((r["step"], math.nan if v is None else float(v)))
    return {b: {lay: {h: sorted(p) for h, p in heads.items()} for lay, heads in sorted(layers.items())}
            for b, layers in out.items()}


def _panel(ax, block: str, layers, cmap, norm, baseline: tuple[float, float] | None) -> None:
    for layer, heads in layers.items():
        colour = cmap(norm(layer))
        for points in heads.values():
            steps, values = zip(*points, strict=True)
            ax.plot(steps, values, color=colour, alpha=0.18, linewidth=0.6)
        steps = sorted({s for points in heads.values() for s, _ in points})
        med = [np.nanmedian([v for points in heads.values() for s2, v in points if s2 == s] or [math.nan])
               for s in steps]
        ax.plot(steps, med, color=colour, linewidth=1.6, marker="o", markersize=2.5)
    if baseline is not None and all(math.isfinite(x) for x in baseline):
        mean, sd = baseline
        ax.axhspan(mean - 3 * sd, mean + 3 * sd, color="0.5", alpha=0.15, linewidth=0)
        ax.axhline(mean, color="0.4", linestyle="--", linewidth=0.8, label="random baseline (mean ± 3 sd)")
        ax.legend(loc="best", frameon=False)
    n_heads = max(len(h) for h in layers.values())
    ax.set_title(f"{block}: {len(layers)} layers × {n_heads} heads", loc="left")
    ax.grid(True, axis="y")


def _mappable(cmap, norm):
    from matplotlib.cm import ScalarMappable

    return ScalarMappable(norm=norm, cmap=cmap)
