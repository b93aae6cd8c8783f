"""A twin folder's HTML report: the setup, the summary, the learning-rate sweep, every run and failure, and the figures
(inline SVG) with their captions, as in the PDF (`qkinspect.report.twin.pdf`)."""

from __future__ import annotations

import datetime as dt
from html import escape

from qkinspect.report.pages import CSS, html_table, svg
from qkinspect.report.tables import Table
from qkinspect.version import __version__


def render_twin_html(twin, *, date: dt.datetime | None = None, name: str | None = None) -> str:
    """A twin folder's report (qkinspect.twin.saved.read_twin) as one HTML string: the setup and its scale, the
    summary in words and as a table, the learning-rate sweep, every run and failure, and the figures (inline SVG)
    with their captions, as in the PDF; `name` (a --title) names the twins."""
    from qkinspect.report.style import new_figure
    from qkinspect.report.twin.figures import twin_name
    from qkinspect.report.twin.pdf import (
        TWIN_NUMBERS,
        failures_table,
        figure_plan,
        lr_table,
        runs_table,
        scale_caveat,
        setup_pairs,
        summary_table,
        verdict_words,
    )

    name = name or twin_name(twin)
    when = (date or dt.datetime.now(dt.timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    pairs = [*setup_pairs(twin), ("folder", str(twin.folder)), ("tool", f"qkinspect {__version__}"), ("date", when)]
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>qkinspect twin report: "
             f"{escape(name)}</title><style>{CSS}</style></head><body>",
             f"<h1>qkinspect twin report: {escape(name)}</h1>",
             html_table(Table("Setup", ["", ""], [list(p) for p in pairs])),
             f"<p><b>{escape(scale_caveat(twin))}</b></p>", "<h2>Summary</h2>",
             *(f"<p>{escape(line)}</p>" for line in verdict_words(twin)), html_table(summary_table(twin)),
             f"<p class='meta'>{escape(TWIN_NUMBERS)}</p>"]
    parts += [html_table(t) for t in (lr_table(twin), failures_table(twin)) if t is not None]
    parts += [f"<p class='meta'>note: {escape(n)}</p>" for n in twin.notes]
    parts += [html_table(runs_table(twin)), "<h2>Figures</h2>"]
    for draw, caption in figure_plan(twin, name):
        parts.append(f"<figure>{svg(draw(new_figure))}<figcaption>{escape(caption)}</figcaption></figure>")
    return "\n".join([*parts, "</body></html>"])
