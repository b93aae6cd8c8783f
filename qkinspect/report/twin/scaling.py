"""The ladder's figure (`plot LADDER --kind scaling`, docs/twin.md "Scale"): each constrained variant's gap to the
standard twin against the standard twin's non-embedding parameters (log x), every shape's interval, the power-law
fit with its bootstrap band where the gaps carry one (qkinspect.twin.scaling), zero and the ± margin."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from qkinspect.errors import InputError
from qkinspect.report.style import Canvas, colours, new_figure, style
from qkinspect.report.titles import suptitle
from qkinspect.twin.ladder import LadderResult, per_seed_gaps
from qkinspect.twin.scaling import band, fit_variant

BAND_ALPHA = 0.18


def scaling_figure(ladder: LadderResult, *, name: str | None = None, canvas: Canvas = new_figure) -> Figure:
    """gap(N) per constrained variant: the mean paired gap at each shape with its interval (the per-shape summary's
    ci_low … ci_high), the fitted a · N^−α with its band, or the reason no power law is drawn.

    Example:
        >>> fig = scaling_figure(read_ladder("ladder"))  # doctest: +SKIP
    """
    rows = [s for s in ladder.summaries if s.summary.variant != "standard" and s.summary.diff is not None]
    if not rows:
        raise InputError(f"{ladder.folder}: no shape has a constrained variant paired with its standard twin yet")
    variants = list(dict.fromkeys(s.summary.variant for s in rows))
    colour = dict(zip(variants, colours(len(variants)), strict=True))
    ns = sorted({s.non_embedding_params for s in rows})
    spread = 0.06 * np.log10(max(ns) / min(ns)) if len(ns) > 1 else 0.05  # side by side at each shape, in log10
    offsets = {v: (i - (len(variants) - 1) / 2) * spread / max(1, len(variants)) for i, v in enumerate(variants)}
    m = ladder.margin
    with style():
        fig = canvas(4.2)
        ax = fig.subplots()
        ax.axhline(0.0, color="0.3", linewidth=0.8)
        if m:
            for y in (-m, m):
                ax.axhline(y, color="0.4", linewidth=0.8, linestyle="--")
        drawn = False
        grid = np.geomspace(min(ns) / 1.3, max(ns) * 1.3, 100) if len(ns) > 1 else None
        for v in variants:
            mine = [s for s in rows if s.summary.variant == v]
            x = np.array([s.non_embedding_params * 10 ** offsets[v] for s in mine], dtype=float)
            y = np.array([s.summary.diff for s in mine], dtype=float)
            low = np.array([np.nan if s.summary.ci_low is None else s.summary.ci_low for s in mine], dtype=float)
            high = np.array([np.nan if s.summary.ci_high is None else s.summary.ci_high for s in mine], dtype=float)
            err = np.vstack([y - low, high - y])
            fit, boot = fit_variant(v, per_seed_gaps(ladder.rungs, ladder.twins, v))
            if fit.describes is False:
                label = f"{v}: no power law (lack of fit p = {fit.p_fit:.3f})"
            elif fit.alpha is not None:
                label = f"{v}: α = {fit.alpha:.2f}"
                if fit.alpha_low is not None:
                    label += f" [{fit.alpha_low:.2f}, {fit.alpha_high:.2f}]"
            else:
                label = f"{v}: no power law ({_short_reason(fit.reason)})"
            ax.errorbar(x, y, yerr=np.where(np.isfinite(err), err, 0), fmt="o", color=colour[v], markersize=4,
                        capsize=3, linewidth=1.2, label=label, zorder=3)
            if fit.describes and grid is not None:  # a rejected law is not drawn: the points say what there is
                drawn = True
                ax.plot(grid, fit.a * grid ** -fit.alpha, color=colour[v], linewidth=1.2, zorder=2)
                if len(boot):
                    lo, hi = band(boot, grid)
                    ax.fill_between(grid, lo, hi, color=colour[v], alpha=BAND_ALPHA, linewidth=0)
        ax.set_xscale("log")
        ax.set_xticks(ns, [_params(n) for n in ns])
        ax.minorticks_off()
        ax.set_xlabel("standard twin's non-embedding parameters (log scale); shapes: "
                      + ", ".join(dict.fromkeys(s.shape for s in sorted(rows, key=lambda s: s.non_embedding_params))))
        ax.set_ylabel("variant − standard held-out loss (nats)")
        ax.grid(True, axis="y")
        level = next((f.level for f in ladder.fits), 0.9)
        fig.legend(loc="outside lower center", frameon=False, ncols=1 if len(variants) > 2 else len(variants),
                   title=f"point: mean gap paired by seed, bar: its interval (the summary's); dashed: ± margin {m:g}"
                         + (f"\nline: a · N^−α fitted to the seeds' gaps; band: {level:.0%} bootstrap over seeds"
                            if drawn else ""),
                   title_fontsize=7.5)
        tpp = f", {ladder.tokens_per_param:g} tokens per parameter" if ladder.tokens_per_param else ""
        suptitle(fig, f"{name or _name(ladder)}: the constraints' cost against model size{tpp}")
    return fig


def _short_reason(reason: str | None) -> str:
    return (reason or "").split(":")[0]


def _params(n: int) -> str:
    return f"{n / 1e6:.3g}M" if n >= 1e6 else f"{n / 1e3:.3g}k"


def _name(ladder: LadderResult) -> str:
    return Path(ladder.folder).resolve().name or str(ladder.folder)
