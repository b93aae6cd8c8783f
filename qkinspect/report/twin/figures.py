"""The twin's figures (docs/twin.md): held-out loss over training (`learning`), the paired gap to the
standard twin (`gap`) and a tracked head metric per layer (`trajectory`). They draw the rows
`qkinspect.twin.curves` computes from a Twin's records; each has its caption beside it, for the report's pages."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import BoundaryNorm, ListedColormap, to_rgba
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from qkinspect.errors import InputError
from qkinspect.numbers import signed_alike
from qkinspect.report.style import HEADS_CMAP, Canvas, colours, human_name, new_figure, style
from qkinspect.report.titles import suptitle
from qkinspect.twin.curves import chosen, gap_curves, learning_curves, margin, trajectory_curves
from qkinspect.twin.results import TwinResult

STANDARD = "black"
BAND_ALPHA = 0.18  # the gap figure's interval (one band per panel)
# the learning figure's ±1 s.d. bands, one per variant on one axes: a light fill with an outline in the variant's
# colour, so that bands that nearly coincide stay apart (filled at 0.18 they merged into one patch)
SD_FILL_ALPHA, SD_EDGE_ALPHA = 0.06, 0.5
# each variant's line: its own dash pattern and marker, drawn above every band and above the standard twin's solid
# black line (which is wider), so that a variant on top of standard shows both
DASHES = [(0, (5, 1.5)), (0, (1, 1.2)), (0, (6, 1.5, 1, 1.5)), (0, (3, 1)), (0, (8, 1.5, 1, 1.5, 1, 1.5)),
          (0, (2, 2)), (0, (10, 2)), (0, (4, 1, 1, 1, 1, 1))]
MARKERS = ["s", "^", "D", "v", "P", "X", "<", ">", "h", "*"]


def twin_name(twin: TwinResult) -> str:
    """What the figures call the twins: the twin folder's name."""
    return Path(twin.folder).resolve().name or str(twin.folder)


def palette(twin: TwinResult) -> dict[str, object]:
    """One colour per variant in every figure: standard black, the others tab10 in the summary's order."""
    others = [v for v in chosen(twin) if v != "standard"]
    return {"standard": STANDARD, **dict(zip(others, colours(len(others)), strict=True))}


def line_styles(twin: TwinResult) -> dict[str, dict[str, object]]:
    """The learning figure's line of each variant (with `palette`'s colour): standard solid, wide and under the
    others; the others dashed, each with its own dash pattern and marker, above it."""
    others = [v for v in chosen(twin) if v != "standard"]
    out: dict[str, dict[str, object]] = {"standard": dict(linestyle="-", linewidth=2.2, marker="o", zorder=3)}
    for i, v in enumerate(others):
        out[v] = dict(linestyle=DASHES[i % len(DASHES)], linewidth=1.3, marker=MARKERS[i % len(MARKERS)], zorder=4)
    return out


def by_rows(items: list, ncols: int) -> list:
    """`items` reordered so that a legend of `ncols` columns (matplotlib fills column by column) reads them row by
    row: column j holds items j, j + ncols, …"""
    return [x for j in range(ncols) for x in items[j::ncols]]


def _label(twin: TwinResult, variant: str) -> str:
    lr, _ = chosen(twin)[variant]
    n = next((s.seeds for s in twin.summaries if s.variant == variant), 0)
    return f"{variant} (lr {lr:g}, {n} seed{'s' if n != 1 else ''})"


# characters of legend text (8 pt, with its marker) that fit across the figure's width
LEGEND_CHARACTERS = 110


def _need_runs(twin: TwinResult) -> None:
    if not twin.summaries:
        raise InputError(f"{twin.folder}: the twin folder has no finished runs to draw yet")


def learning_figure(twin: TwinResult, *, name: str | None = None, canvas: Canvas = new_figure) -> Figure:
    """Held-out loss against step: per variant the mean over seeds (line) and ±1 s.d. (band); beside it, with
    four or more evaluations, the second half of training on its own scale (where the variants part).

    Example:
        >>> fig = learning_figure(read_twin("twin-out"))  # doctest: +SKIP
    """
    _need_runs(twin)
    by = _by_variant(learning_curves(twin), order=list(chosen(twin)))
    colour, styles = palette(twin), line_styles(twin)
    steps_all = sorted({p.step for pts in by.values() for p in pts})
    zoom = len(steps_all) >= 4
    with style():
        fig = canvas(3.8)
        axes = fig.subplots(1, 2 if zoom else 1, squeeze=False, width_ratios=[3, 2] if zoom else None)[0]
        for k, ax in enumerate(axes):
            start = steps_all[len(steps_all) // 2] if k else -np.inf
            for variant, pts in by.items():
                steps, mean, sd = _arrays([p for p in pts if p.step >= start])
                ax.plot(steps, mean, color=colour[variant], markersize=3, label=_label(twin, variant),
                        **styles[variant])
                if np.isfinite(sd).any():  # below every line (zorder 1), light, outlined
                    ax.fill_between(steps, mean - sd, mean + sd, facecolor=to_rgba(colour[variant], SD_FILL_ALPHA),
                                    edgecolor=to_rgba(colour[variant], SD_EDGE_ALPHA), linewidth=0.6, zorder=1)
            ax.set_xlabel("training step")
            ax.set_ylabel("held-out loss (nats per token)")
            ax.grid(True, axis="y")
        if zoom:
            axes[1].set_title("second half, on its own scale", loc="left", fontsize=8.5)
        # as many columns as the longest label leaves room for (11 arms' labels in 3 columns ran off both edges),
        # read row by row: standard first, then the variants left to right in the summary's order
        longest = max(len(_label(twin, v)) for v in by)
        ncols = max(1, min(3, len(by), LEGEND_CHARACTERS // (longest + 6)))
        fig.legend(handles=by_rows(axes[0].get_lines(), ncols), loc="outside lower center", frameon=False,
                   ncols=ncols, title="line: mean over seeds; band (outlined): ±1 s.d. over seeds", title_fontsize=8)
        suptitle(fig, f"{name or twin_name(twin)}: held-out loss over training")
    return fig


def gap_figure(twin: TwinResult, *, name: str | None = None, canvas: Canvas = new_figure) -> Figure:
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
            final = f"final {gap_words(s)}" if s is not None else ""
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


def gap_words(s) -> str:
    """A summary's final difference, its interval and its verdict as `qkinspect twin` prints the numbers (signed,
    4 decimals or two significant digits, no negative zero: qkinspect.numbers): "+0.0712 [+0.0650, +0.0774]: worse"."""
    diff, low, high = signed_alike(s.diff, s.ci_low, s.ci_high, missing="n/a")
    interval = f"[{low}, {high}]" if s.ci_low is not None else "(no interval: one seed)"
    return f"{diff} {interval}: {s.verdict}"


# W_K tied to W_Q (a "+params" arm too): their heads' Q/K form is one matrix, so these metrics are fixed at every step
TIED = ("share_qk", "share_qk_reformer", "symmetric", "share_qkv")
BY_CONSTRUCTION = {"symmetry": 1.0, "overlap_qk": 1.0}
CONSTANT_TOLERANCE = 1e-4  # float32 weights: a tied head's symmetry or overlap reads 1 within ~1e-7
LAYER_COLOURS = (0.0, 0.8)  # the part of the layer colormap used: viridis' light end (yellow) vanishes on white


def constant_variants(twin: TwinResult, metric: str, curves=None) -> list[str]:
    """The variants whose `metric` is fixed by construction (W_K tied to W_Q: symmetry and Q/K overlap 1) and whose
    curves are that value at every layer and step (within CONSTANT_TOLERANCE): the trajectory figure leaves their
    panels out, and its caption names them."""
    value = BY_CONSTRUCTION.get(metric)
    if value is None:
        return []
    curves = trajectory_curves(twin, metric) if curves is None else curves
    out = []
    for v in dict.fromkeys(p.variant for p in curves):
        if v.split("+")[0] in TIED and all(abs(p.mean - value) <= CONSTANT_TOLERANCE
                                           and (p.sd or 0.0) <= CONSTANT_TOLERANCE for p in curves if p.variant == v):
            out.append(v)
    return out


def model_dims(twin: TwinResult) -> tuple[int | None, int | None, int | None]:
    """(d_model, heads, d_head) of the twins' model, from its transformers config (llama's names, then gpt2's)."""
    cfg = twin.setup.get("model", {}).get("config", {}) or {}
    width = next((cfg[k] for k in ("hidden_size", "n_embd") if cfg.get(k) is not None), None)
    heads = next((cfg[k] for k in ("num_attention_heads", "n_head") if cfg.get(k) is not None), None)
    d_head = cfg.get("head_dim") or (width // heads if isinstance(width, int) and isinstance(heads, int) and heads
                                     else None)
    return width, heads, d_head


def overlap_chance(twin: TwinResult) -> float | None:
    """The Q/K subspace overlap of random heads: two uniformly random d_head-dimensional subspaces of the
    d_model-dimensional input have mean cos² of their principal angles d_head / d_model in expectation (the
    analysis' random baseline; docs/metrics.md)."""
    width, _, d_head = model_dims(twin)
    return min(1.0, d_head / width) if isinstance(width, int) and isinstance(d_head, int) and width else None


def trajectory_figure(twin: TwinResult, metric: str, *, name: str | None = None, canvas: Canvas = new_figure,
                      every_panel: bool = False) -> Figure:
    """A tracked head metric against step: one panel per variant, per layer the mean over seeds of the median
    over the layer's heads (line, colour = layer) and ±1 s.d. over seeds (band); for the Q/K overlap, its chance
    level (d_head / d_model). The panels of variants that fix the metric by construction (`constant_variants`) are
    left out unless `every_panel`."""
    _need_runs(twin)
    pts = trajectory_curves(twin, metric)
    dropped = [] if every_panel else constant_variants(twin, metric, pts)
    if len(dropped) == len({p.variant for p in pts}):  # nothing would be left: draw them all
        dropped = []
    by: dict = defaultdict(lambda: defaultdict(list))
    for p in pts:
        if p.variant not in dropped:
            by[p.variant][p.layer].append(p)
    n_layers = 1 + max(p.layer for p in pts)
    rows, cols = _grid(len(by))
    cmap = ListedColormap(colormaps[HEADS_CMAP](np.linspace(*LAYER_COLOURS, n_layers)))
    norm = BoundaryNorm(np.arange(n_layers + 1) - 0.5, n_layers)
    chance = overlap_chance(twin) if metric == "overlap_qk" else None
    with style():
        fig = canvas(0.7 + 2.3 * rows)
        axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True).ravel()
        for ax, (variant, layers) in zip(axes, by.items(), strict=False):
            if chance is not None:
                ax.axhline(chance, color="0.45", linewidth=1.0, linestyle=":", zorder=1)
            for layer, lpts in sorted(layers.items()):
                steps, mean, sd = _arrays(lpts)
                c = cmap(norm(layer))
                ax.plot(steps, mean, color=c, linewidth=1.4, marker="o", markersize=2.5, zorder=3)
                if np.isfinite(sd).any():
                    ax.fill_between(steps, mean - sd, mean + sd, color=c, alpha=BAND_ALPHA, linewidth=0, zorder=2)
            ax.set_title(_label(twin, variant), loc="left", fontsize=8.5)
            ax.grid(True, axis="y")
        _frame(axes, len(by), cols, human_name(metric))
        from matplotlib.cm import ScalarMappable

        bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=[a for a in axes if a.get_visible()],
                           label="layer", aspect=30, shrink=min(1.0, 0.25 + 0.15 * n_layers))
        bar.set_ticks(range(n_layers))
        key = [Line2D([], [], color="0.2", linewidth=1.4, marker="o", markersize=2.5,
                      label="per layer (colour): median over its heads, mean over seeds"),
               Patch(color="0.2", alpha=BAND_ALPHA, label="±1 s.d. over seeds")]
        if chance is not None:
            key.append(Line2D([], [], color="0.45", linewidth=1.0, linestyle=":",
                              label=f"chance: d_head / d_model = {chance:.3g}"))
        ncols = min(2, len(key))
        fig.legend(handles=by_rows(key, ncols), loc="outside lower center", ncols=ncols, frameon=False)
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


def learning_caption(twin: TwinResult) -> str:
    return ("Held-out loss (mean cross-entropy in nats per token on the fixed held-out windows) against the "
            "training step, each variant at its chosen learning rate. Line: the mean over seeds; band: ±1 "
            "standard deviation over seeds (the spread from seed to seed, not an interval of the mean; the gap "
            "figure gives that). Right (with four or more evaluations): the second half of training on its own "
            "scale, where the variants part. Steps enter where every seed was evaluated. Every twin sees the same "
            "batches in the same order for a given seed, and each constrained twin starts from its standard twin's "
            "initial weights.")


def gap_caption(twin: TwinResult) -> str:
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


def _tested(twin: TwinResult) -> int:
    """The constrained variants whose tests were run (the Holm family's size)."""
    return sum(s.p_one_sided_better is not None for s in twin.summaries)


def trajectory_caption(twin: TwinResult, metric: str) -> str:
    from qkinspect.metrics.registry import METRICS

    spec = METRICS.get(metric)
    named = human_name(metric)[:1].upper() + human_name(metric)[1:]  # Q/K stays Q/K
    define = f" {named} ({metric}): {spec.description}." if spec is not None else ""
    rng = f" Range {spec.range}." if spec is not None and spec.range else ""
    dropped = constant_variants(twin, metric)
    if len(dropped) == len({p.variant for p in trajectory_curves(twin, metric)}):
        dropped = []
    value = BY_CONSTRUCTION.get(metric)
    left_out = (f" Not drawn: {_and(dropped)}, whose {human_name(metric)} is {value:g} at every step by "
                "construction (W_K tied to W_Q)." if dropped else "")
    chance = overlap_chance(twin) if metric == "overlap_qk" else None
    dotted = (f" Dotted line: chance, d_head / d_model = {chance:.3g} (the mean overlap of two random subspaces of "
              "these sizes)." if chance is not None else "")
    return (f"{named} measured from the weights while the twins trained, one panel per "
            "variant at its chosen learning rate. Line: per layer (colour), the median over the layer's heads in "
            "each seed, then the mean over seeds; band: ±1 s.d. over seeds. A constraint that ties W_K to W_Q "
            "fixes some metrics by construction (symmetry and Q/K overlap 1 for share_qk, share_qk_reformer, "
            f"share_qkv and symmetric).{left_out}{dotted}{define}{rng}")


def _and(names: list[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
