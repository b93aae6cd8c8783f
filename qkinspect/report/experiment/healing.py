"""The healing figure, drawn from the healing records of `qkinspect experiment --heal S --heal-eval-every N` (its
JSON read back by qkinspect.experiment.saved): each edit's cost after healing against the fine-tuning steps (the
healed edited loss minus the healed control's at the same step, ± one standard error as a band), and beside it the
control's own curve (its loss minus the unedited model's). Only arranging and drawing the records here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.ticker import MaxNLocator

from qkinspect.errors import InputError
from qkinspect.experiment.results import ExperimentResult, HealedRun, HealPoint
from qkinspect.report.style import Canvas, new_figure
from qkinspect.report.titles import suptitle


def run_label(run: HealedRun) -> str:
    """`share_qk L3`, `share_qk L3 H2`, `share_qk (all chosen heads)`."""
    if run.layer is None:
        return f"{run.edit} (all chosen heads)"
    return f"{run.edit} L{run.layer}" + ("" if run.head is None else f" H{run.head}")


STYLES = ("-", "--", ":", "-.")  # one per unit (layer), the colour one per edit


def _band(ax, curve: tuple[HealPoint, ...], colour: str, label: str, ls: str = "-") -> None:
    steps = np.array([p.step for p in curve], dtype=float)
    y = np.array([p.diff for p in curve], dtype=float)
    se = np.array([np.nan if p.se is None else p.se for p in curve], dtype=float)
    ax.plot(steps, y, color=colour, lw=1.3, ls=ls, marker="o", ms=2.5, label=label)
    if np.isfinite(se).any():
        ax.fill_between(steps, y - se, y + se, color=colour, alpha=0.2, lw=0)


def healing_figure(result: ExperimentResult, canvas: Canvas = new_figure, title: str | None = None):
    """Cost after healing against steps, one line per healed run with its ± 1 s.e. band; the control's own curve
    in a panel beside it.

    Raises:
        InputError: the document holds no healing scored at more than one step (run with --heal-eval-every).
    """
    h = result.healing
    runs = [r for r in h.runs if len(r.curve) > 1] if h is not None else []
    control = h.control_curve if h is not None else ()
    if h is None or not runs or len(control) < 2:
        raise InputError("the healing figure needs healing scored along the way: qkinspect experiment --heal STEPS "
                         "--heal-eval-every N -o FILE.json")
    fig = canvas(3.4)
    left, right = fig.subplots(1, 2, width_ratios=[2, 1])
    edits = list(dict.fromkeys(r.edit for r in runs))
    units = list(dict.fromkeys((r.layer, r.head) for r in runs))
    for r in runs:
        _band(left, r.curve, f"C{edits.index(r.edit) % 10}", run_label(r),
              STYLES[units.index((r.layer, r.head)) % len(STYLES)])
    left.axhline(0, color="grey", lw=0.8)
    left.set_xlabel("healing steps")
    left.set_ylabel("Δloss: healed edit − healed control")
    left.set_title("the edit's cost while healing (band ± 1 s.e.)")
    left.legend(fontsize="x-small", frameon=False, ncols=1 + (len(runs) > 6), handlelength=3)
    _band(right, control, "black", "control")
    right.axhline(0, color="grey", lw=0.8)
    right.set_xlabel("healing steps")
    right.set_ylabel("Δloss: control − unedited")
    right.set_title("the control (no edit)")
    for ax, bins in ((left, "auto"), (right, 4)):  # the narrow panel: fewer ticks, so 3-digit steps do not touch
        ax.xaxis.set_major_locator(MaxNLocator(nbins=bins, integer=True))
    name = Path(str(result.model.name or "")).name
    precision = h.precision.dtype if h.precision is not None else "float32"
    suptitle(fig, title or f"{name}: healing, {h.steps} steps of {h.batch_windows} windows, trained "
                           f"{h.train}, lr {h.lr:g}, {precision} on {h.device}")
    return fig
