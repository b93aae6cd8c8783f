"""A sweep's report: a cover page saying what was swept, then one trajectory figure per metric (docs/sweep.md)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import IO

from matplotlib.figure import Figure

from qkinspect.report.style import PAGE, style
from qkinspect.report.sweep.trajectory import sweep_trajectory
from qkinspect.report.titles import fit

# Drawn when the sweep computed them, in this order; otherwise its first per-head metrics.
METRICS = ("symmetry", "shared_qk_distance", "qk_effective_rank", "qk_stable_rank", "overlap_qk", "directionality")
NOT_METRICS = ("checkpoint", "step", "block", "layer", "head", "kv_head")


def sweep_metrics(sweep) -> list[str]:
    rows = sweep.rows()
    have = [k for k in (rows[0] if rows else {}) if k not in NOT_METRICS]
    return [m for m in METRICS if m in have] or have[:4]


def write_sweep_pdf(sweep, target: str | Path | IO[bytes], *, date: dt.datetime | None = None,
                    title: str | None = None) -> int:
    """Write the report of a sweep folder (qkinspect.sweep.read_sweep) as a PDF; returns the number of pages.
    `title` names what was swept in the cover and figure titles (default: the folder and its checkpoints)."""
    from matplotlib.backends.backend_pdf import PdfPages

    from qkinspect.version import __version__

    metrics = sweep_metrics(sweep)
    with style(), PdfPages(target, metadata={"Title": f"qkinspect sweep report: {title or sweep.folder}"}) as pdf:
        pdf.savefig(_cover(sweep, metrics, __version__, date or dt.datetime.now(dt.timezone.utc), title))
        for metric in metrics:  # each its own figure (style.new_figure), a page of its own
            pdf.savefig(sweep_trajectory(sweep, metric, name=title))
        return 1 + len(metrics)


def cover_lines(sweep, metrics: list[str], version: str, date: dt.datetime) -> list[tuple[str, int]]:
    """The cover's lines (text, font size) of a sweep's report, PDF and HTML alike: what was swept, with what."""
    steps = [c.step for c in sweep.checkpoints]
    opts = ", ".join(f"{k} {v}" for k, v in sweep.options.items() if v not in (None, False))
    return [
        ("qkinspect sweep report", 16),
        (f"folder: {sweep.folder}", 10),
        (f"{len(sweep.checkpoints)} checkpoints, steps {min(steps, default=0)}-{max(steps, default=0)}; "
         f"{len(sweep.results)} with results, {len(sweep.failures)} failed", 10),
        (f"options: {opts or 'defaults'}", 10),
        (f"figures: {', '.join(metrics)} against training step (per-layer median over heads; each head faint)", 10),
        (f"qkinspect {version}, {date:%Y-%m-%d %H:%M} UTC", 9),
    ]


def _cover(sweep, metrics: list[str], version: str, date: dt.datetime, title: str | None = None) -> Figure:
    lines = [
        *cover_lines(sweep, metrics, version, date),
        *([(title, 12)] if title else []),
        ("", 9),
        ("checkpoints:", 10),
        *[(f"  step {c.step}: {c.name}" + ("" if c.identity in sweep.results else "  (no result)"), 8)
          for c in sweep.checkpoints[:60]],
        *([(f"  … and {len(sweep.checkpoints) - 60} more", 8)] if len(sweep.checkpoints) > 60 else []),
        *[(f"failed: {f.name}: {f.error}"[:150], 8) for f in sweep.failures[:10]],
    ]
    fig = Figure(figsize=PAGE)
    y = 0.95
    for text, size in lines:
        for line in fit(text, PAGE[0] * 0.84, size).split("\n"):  # long paths wrap inside the page
            fig.text(0.08, y, line, fontsize=size, va="top")
            y -= size / 72 / PAGE[1] * 1.5
    return fig
