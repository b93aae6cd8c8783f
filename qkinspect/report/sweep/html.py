"""A sweep's HTML report: the cover's facts, every checkpoint and failure in a table, and one trajectory figure per
metric (inline SVG), as in the PDF (`qkinspect.report.sweep.pdf`)."""

from __future__ import annotations

import datetime as dt
from html import escape

from qkinspect.report.pages import CSS, html_table, svg
from qkinspect.report.tables import Table
from qkinspect.version import __version__


def render_sweep_html(sweep, *, date: dt.datetime | None = None, name: str | None = None) -> str:
    """A sweep's report (qkinspect.sweep.read_sweep) as one HTML string: the cover's facts, every checkpoint and
    failure in a table, and one trajectory figure per metric (inline SVG), as in the PDF; `name` (a --title) names
    what was swept."""
    from qkinspect.report.sweep.pdf import caption, cover_lines, sweep_metrics, sweep_name
    from qkinspect.report.sweep.trajectory import sweep_trajectory

    metrics = sweep_metrics(sweep)
    name = name or sweep_name(sweep)
    (title, _), *facts = cover_lines(sweep, metrics, __version__, date or dt.datetime.now(dt.timezone.utc), name)
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{escape(title)}: "
             f"{escape(name or str(sweep.folder))}</title><style>{CSS}</style></head><body>",
             f"<h1>{escape(title + (': ' + name if name else ''))}</h1>",
             *(f"<p class='meta'>{escape(text)}</p>" for text, _ in facts)]
    rows = [[str(c.step), c.name, "yes" if c.identity in sweep.results else "no"] for c in sweep.checkpoints]
    parts.append(html_table(Table("Checkpoints", ["step", "checkpoint", "result"], rows)))
    if sweep.failures:
        failures = [[f.name, f.error] for f in sweep.failures]
        parts.append(html_table(Table("Failures", ["checkpoint", "error"], failures)))
    parts.append("<h2>Figures</h2>")
    for metric in metrics:
        fig = sweep_trajectory(sweep, metric, name=name)
        parts.append(f"<figure>{svg(fig)}<figcaption>{escape(caption(sweep, metric))}</figcaption></figure>")
    return "\n".join([*parts, "</body></html>"])
