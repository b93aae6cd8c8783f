"""The analysis report as one self-contained HTML file: the same words, figures (inline SVG) and tables as the PDF
(the sweep's, the atlas's and the twin's HTML pages live with their subjects: report/sweep, report/atlas, report/twin).

Example:
    >>> import qkinspect
    >>> from qkinspect.report.analysis.html import render_html
    >>> page = render_html(qkinspect.analyze(None, metrics=["default", "head_overlap"]))
"""

from __future__ import annotations

import datetime as dt
from html import escape

from qkinspect.analysis.results import AnalysisResult
from qkinspect.errors import InputError
from qkinspect.report.analysis.arrays import renamed
from qkinspect.report.analysis.figures import figure
from qkinspect.report.analysis.pdf import plan_figures
from qkinspect.report.analysis.summary import summary
from qkinspect.report.analysis.tables import layer_tables
from qkinspect.report.analysis.text import blocks_table, gauge_words, metric_definitions, processing_pairs
from qkinspect.report.pages import CSS, html_table, svg
from qkinspect.report.style import NUMBER_NOTE
from qkinspect.report.tables import Table
from qkinspect.version import __version__


def render_html(result: AnalysisResult, *, date: dt.datetime | None = None, title: str | None = None) -> str:
    """The whole report as an HTML string (figures embedded as SVG, so the file stands alone); `title` names the
    model in the page's title and the figures' titles."""
    if not result.heads:
        raise InputError("the report needs at least one analysed head")
    date = date or dt.datetime.now(dt.timezone.utc)
    name = escape(title or result.model.name)
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>qkinspect report: {name}</title>"
             f"<style>{CSS}</style></head><body>", f"<h1>qkinspect report: {name}</h1>",
             _cover(result, date), _summary(result), _definitions(result), _figures(renamed(result, title)),
             "<h2>Per-layer tables</h2>", f"<p class='meta'>{escape(NUMBER_NOTE)}</p>",
             *(html_table(t) for t in layer_tables(result)), "</body></html>"]
    return "\n".join(parts)


def _cover(result: AnalysisResult, date: dt.datetime) -> str:
    m = result.model
    ident = [("source", m.source), ("model type", m.model_type), ("architecture", m.architecture or "n/a"),
             ("format", m.format), ("revision", m.revision or "n/a"), ("storage dtype", m.dtype or "n/a"),
             ("tool", f"qkinspect {__version__}"), ("date", date.strftime("%Y-%m-%d %H:%M %Z").strip()),
             ("heads analysed", str(len(result.heads)))]
    proc = processing_pairs(result)
    return (html_table(Table("Model", ["", ""], [list(p) for p in ident])) + html_table(blocks_table(result))
            + html_table(Table("Processing", ["", ""], [list(p) for p in proc])))


def _summary(result: AnalysisResult) -> str:
    out = ["<h2>Summary</h2>"]
    for s in summary(result):
        out.append(f"<h3>{escape(s.title)}</h3>")
        out += [f"<p>{escape(p)}</p>" for p in s.paragraphs]
    return "\n".join(out)


def _definitions(result: AnalysisResult) -> str:
    out = ["<h2>Definitions</h2><dl>"]
    for d in metric_definitions(result.metric_names):
        facts = "; ".join(f for f in (f"range {d['range']}" if d.get("range") else "",
                                      gauge_words(d.get("gauge_invariant")), d.get("reference") or "") if f)
        out.append(f"<dt><b>{escape(d['name'])}</b></dt><dd>{escape(d.get('description', ''))}"
                   f"<br><span class='meta'>{escape(facts)}</span></dd>")
    return "\n".join([*out, "</dl>"])


def _figures(result: AnalysisResult) -> str:
    out = ["<h2>Figures</h2>"]
    for plan in plan_figures(result):
        try:
            fig = figure(result, plan.kind, block=plan.block)
        except InputError as e:
            out.append(f"<p class='meta'>{escape(plan.kind)} left out: {escape(str(e))}</p>")
            continue
        out.append(f"<figure>{svg(fig)}<figcaption>{escape(plan.caption)}</figcaption></figure>")
    return "\n".join(out)
