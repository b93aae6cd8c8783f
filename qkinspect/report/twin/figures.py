"""The twin's figures (docs/twin.md): held-out loss over training (`learning`), the paired gap to the
standard twin (`gap`) and a tracked head metric per layer (`trajectory`). They draw the rows
`qkinspect.twin.curves` computes from a Twin's records; each has its caption beside it, for the report's pages."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import BoundaryNorm
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from qkinspect.errors import InputError
from qkinspect.report.style import HEADS_CMAP, Canvas, colours, fmt, human_name, new_figure, style
from qkinspect.report.titles import suptitle
from qkinspect.twin.curves import chosen, gap_curves, learning_curves, margin, trajectory_curves
from qkinspect.twin.results import Twin

STANDARD = "black"
BAND_ALPHA = 0.18


def twin_name(twin: Twin) -> str:
    """What the figures call the twins: the twin folder's name."""
    return Path(twin.folder).resolve().name or str(twin.folder)


def palette(twin: Twin) -> dict[str, object]:
    """One colour per variant in every figure: standard black, the others tab10 in the summary's order."""
    others = [v for v in chosen(twin) if v != "standard"]
    return {"standard": STANDARD, **dict(zip(others, colours(len(others)), strict=True))}


def _label(twin: Twin, variant: str) -> str:
    lr, _ = chosen(twin)[variant]
    n = next((s.seeds for s in twin.summaries if s.variant == variant), 0)
    return f"{variant} (lr {lr:g}, {n} seed{'s' if n != 1 else ''})"


# characters of legend text (8 pt, with its marker) that fit across the figure's width
LEGEND_CHARACTERS = 110


def _need_runs(twin: Twin) -> None:
    if not twin.summaries:
        raise InputError(f"{twin.folder}: the twin folder has no finished runs to draw yet")


def learning_figure(twin: Twin, *, name: str | None = None, canvas: Canvas = new_figure) -> Figure:
    """Held-out loss against step: per variant the mean over seeds (line) and ±1 s.d. (band); beside it, with
    four or more evaluations, the second half of training on its own scale (where the variants part).

    Example:
        >>> fig = learning_figure(read_twin("twin-out"))  # doctest: +SKIP
    """
    _need_runs(twin)
    by = _by_variant(learning_curves(twin), order=list(chosen(twin)))
    colour = palette(twin)
    steps_all = sorted({p.step for pts in by.values() for p in pts})
    zoom = len(steps_all) >= 4
    with style():
        fig = canvas(3.8)
        axes = fig.subplots(1, 2 if zoom else 1, squeeze=False, width_ratios=[3, 2] if zoom else None)[0]
        for k, ax in enumerate(axes):
            start = steps_all[len(steps_all) // 2] if k else -np.inf
            for variant, pts in by.items():
                steps, mean, sd = _arrays([p for p in pts if p.step >= start])
                ax.plot(steps, mean, color=colour[variant], linewidth=1.5, marker="o", markersize=2.5,
                        label=_label(twin, variant), zorder=3 if variant == "standard" else 2)
                if np.isfinite(sd).any():
                    ax.fill_between(steps, mean - sd, mean + sd, color=colour[variant], alpha=BAND_ALPHA,
                                    linewidth=0)
            ax.set_xlabel("training step")
            ax.grid(True, axis="y")
        axes[0].set_ylabel("held-out loss (nats per token)")
        if zoom:
            axes[1].set_title("second half, on its own scale", loc="left", fontsize=8.5)
        # as many columns as the longest label leaves room for (11 arms' labels in 3 columns ran off both edges)
        longest = max(len(_label(twin, v)) for v in by)
        fig.legend(handles=axes[0].get_lines(), loc="outside lower center", frameon=False,
                   ncols=max(1, min(3, len(by), LEGEND_CHARACTERS // (longest + 6))),
                   title="line: mean over seeds; band: ±1 s.d. over seeds", title_fontsize=8)
        suptitle(fig, f"{name or twin_name(twin)}: held-out loss over training")
    return fig


def gap_figure(twin: Twin, *, name: str | None = None, canvas: Canvas = new_figure) -> Figure:
    """variant − standard held-out loss against step, paired by seed: one panel per variant, the mean (line), its
    90 % t-interval (band: the interval of the two one-sided tests at 5 %), zero and the ± margin of those tests."""
    _need_runs(twin)
    by = _by_variant(gap_curves(twin), order=list(chosen(twin)))
    if not by:
        raise InputError(f"{twin.folder}: no variant has runs paired with a standard twin's to draw the gap of")
    colour = palette(twin)
    m = margin(twin)
    verdicts = {s.variant: s for s in twin.summaries}
    rows, cols = _grid(len(by))
    with style():
        fig = canvas(0.6 + 2.5 * rows)
        axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True).ravel()
        for ax, (variant, pts) in zip(axes, by.items(), strict=False):
            steps = np.array([p.step for p in pts], dtype=float)
            diff = np.array([p.diff for p in pts], dtype=float)
            low = np.array([np.nan if p.ci_low is None else p.ci_low for p in pts], dtype=float)
            high = np.array([np.nan if p.ci_high is None else p.ci_high for p in pts], dtype=float)
            ax.axhline(0.0, color="0.3", linewidth=0.8)
            if m:
                for y in (-m, m):
                    ax.axhline(y, color="0.4", linewidth=0.8, linestyle="--")
            ax.fill_between(steps, low, high, color=colour[variant], alpha=BAND_ALPHA, linewidth=0)
            ax.plot(steps, diff, color=colour[variant], linewidth=1.5, marker="o", markersize=2.5)
            s = verdicts.get(variant)
            interval = f"[{fmt(s.ci_low)}, {fmt(s.ci_high)}]" if s is not None and s.ci_low is not None else \
                "(no interval: one seed)"
            final = f"final {fmt(s.diff)} {interval}: {s.verdict}" if s is not None else ""
            n = f" ({pts[-1].seeds} paired seed{'s' if pts[-1].seeds != 1 else ''})"
            ax.set_title(f"{variant}{n}\n{final}", loc="left", fontsize=8.5)
            ax.grid(True, axis="y")
        _frame(axes, len(by), cols, "variant − standard (nats)")
        key = [Line2D([], [], color="0.2", linewidth=1.5, marker="o", markersize=2.5, label="mean over seeds"),
               Patch(color="0.2", alpha=BAND_ALPHA, label="90 % t-interval of the mean")]
        if m:
            key.append(Line2D([], [], color="0.4", linewidth=0.8, linestyle="--", label=f"± margin {m:g} nats"))
        fig.legend(handles=key, loc="outside lower center", ncols=len(key), frameon=False)
        suptitle(fig, f"{name or twin_name(twin)}: held-out loss minus the standard twin's, paired by seed")
    return fig


def trajectory_figure(twin: Twin, metric: str, *, name: str | None = None, canvas: Canvas = new_figure) -> Figure:
    """A tracked head metric against step: one panel per variant, per layer the mean over seeds of the median
    over the layer's heads (line, colour = layer) and ±1 s.d. over seeds (band)."""
    _need_runs(twin)
    pts = trajectory_curves(twin, metric)
    by: dict = defaultdict(lambda: defaultdict(list))
    for p in pts:
        by[p.variant][p.layer].append(p)
    n_layers = 1 + max(p.layer for p in pts)
    rows, cols = _grid(len(by))
    cmap = colormaps[HEADS_CMAP]
    norm = BoundaryNorm(np.arange(n_layers + 1) - 0.5, cmap.N)
    with style():
        fig = canvas(0.7 + 2.3 * rows)
        axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True).ravel()
        for ax, (variant, layers) in zip(axes, by.items(), strict=False):
            for layer, lpts in sorted(layers.items()):
                steps, mean, sd = _arrays(lpts)
                c = cmap(norm(layer))
                ax.plot(steps, mean, color=c, linewidth=1.4, marker="o", markersize=2.5)
                if np.isfinite(sd).any():
                    ax.fill_between(steps, mean - sd, mean + sd, color=c, alpha=BAND_ALPHA, linewidth=0)
            ax.set_title(_label(twin, variant), loc="left", fontsize=8.5)
            ax.grid(True, axis="y")
        _frame(axes, len(by), cols, human_name(metric))
        from matplotlib.cm import ScalarMappable

        bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=[a for a in axes if a.get_visible()],
                           label="layer", aspect=30, shrink=min(1.0, 0.25 + 0.15 * n_layers))
        bar.set_ticks(range(n_layers))
        fig.legend(handles=[Line2D([], [], color="0.2", linewidth=1.4, marker="o", markersize=2.5,
                                   label="per layer (colour): median over its heads, mean over seeds"),
                            Patch(color="0.2", alpha=BAND_ALPHA, label="±1 s.d. over seeds")],
                   loc="outside lower center", ncols=2, frameon=False)
        suptitle(fig, f"{name or twin_name(twin)}: {human_name(metric)} ({metric}) over training")
    return fig


def _grid(n: int) -> tuple[int, int]:
    """(rows, cols) of n panels: one column up to three, else two (an empty cell at most, never five rows of
    one)."""
    return (n, 1) if n <= 3 else (-(-n // 2), 2)


def _frame(axes, n: int, cols: int, y_label: str) -> None:
    """Small multiples' labels: the cells past `n` hidden, `y_label` on the left column, the step axis under
    every panel with no panel below it (the last row, and the row above an empty cell)."""
    for i, ax in enumerate(axes):
        if i >= n:
            ax.set_visible(False)
            continue
        if i % cols == 0:
            ax.set_ylabel(y_label)
        if i + cols >= n:
            ax.set_xlabel("training step")
            ax.xaxis.set_tick_params(labelbottom=True)


def _by_variant(points, order: list[str]) -> dict[str, list]:
    """variant -> its points, variants in `order` (the summary's: standard first)."""
    out: dict[str, list] = {v: [] for v in order}
    for p in points:
        out.setdefault(p.variant, []).append(p)
    return {v: pts for v, pts in out.items() if pts}


def _arrays(points) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, means, s.d.s; NaN where one seed) of CurvePoints in step order."""
    points = sorted(points, key=lambda p: p.step)
    return (np.array([p.step for p in points], dtype=float), np.array([p.mean for p in points], dtype=float),
            np.array([np.nan if p.sd is None else p.sd for p in points], dtype=float))


# -- captions --------------------------------------------------------------------------------------------------


def learning_caption(twin: Twin) -> str:
    return ("Held-out loss (mean cross-entropy in nats per token on the fixed held-out windows) against the "
            "training step, each variant at its chosen learning rate. Line: the mean over seeds; band: ±1 "
            "standard deviation over seeds (the spread from seed to seed, not an interval of the mean; the gap "
            "figure gives that). Right (with four or more evaluations): the second half of training on its own "
            "scale, where the variants part. Steps enter where every seed was evaluated. Every twin sees the same "
            "batches in the same order for a given seed, and each constrained twin starts from its standard twin's "
            "initial weights.")


def gap_caption(twin: Twin) -> str:
    m = margin(twin)
    tests = (f"Dashed lines: ± the margin of {m:g} nats of the two one-sided tests; the verdict (panel title, "
             "from the final step) is 'not worse' where a one-sided t-test at the 5 % level puts the mean "
             "difference below +margin, 'better' below −margin, 'worse' above +margin: with one variant, exactly "
             "where the final 90 % band lies against the margin lines"
             + ("; with several, each test's p-values are Holm-corrected over the variants, so a band that clears a "
                "margin line can still be 'can't tell'" if _tested(twin) > 1 else "") + ").") if m else ""
    return ("Held-out loss of each variant minus the standard twin's, paired by seed (the same seed: the same "
            "initial weights and batches), against the training step; positive means the variant is worse. Line: "
            "the mean difference over seeds; band: its 90 % t-interval, mean ± t(0.95, n − 1) · s.d. / √n "
            "(absent with one seed). Solid grey line: zero. " + tests)


def _tested(twin: Twin) -> int:
    """The constrained variants whose tests were run (the Holm family's size)."""
    return sum(s.p_one_sided_better is not None for s in twin.summaries)


def trajectory_caption(twin: Twin, metric: str) -> str:
    from qkinspect.metrics.registry import METRICS

    spec = METRICS.get(metric)
    named = human_name(metric)[:1].upper() + human_name(metric)[1:]  # Q/K stays Q/K
    define = f" {named} ({metric}): {spec.description}." if spec is not None else ""
    rng = f" Range {spec.range}." if spec is not None and spec.range else ""
    return (f"{named} measured from the weights while the twins trained, one panel per "
            "variant at its chosen learning rate. Line: per layer (colour), the median over the layer's heads in "
            "each seed, then the mean over seeds; band: ±1 s.d. over seeds. A constraint that ties W_K to W_Q "
            "fixes some metrics by construction (symmetry and Q/K overlap 1 for share_qk, share_qkv and "
            f"symmetric).{define}{rng}")
