"""The heads report (`qkinspect report HEADS.json`): what was measured, the strongest heads of each score, the
relations table, and the scatter of each related metric with its most related score; PDF and HTML alike."""

from __future__ import annotations

import datetime as dt
from html import escape
from typing import IO

from qkinspect.report.heads.figures import CAPTION, SCORE_NAMES, heads_figure
from qkinspect.report.tables import Table
from qkinspect.version import __version__

TOP = 5


def facts(result) -> list[str]:
    s, info = result.settings, result.model
    spec = info.blocks[0]
    return [f"model: {info.name} ({info.model_type}, {'causal' if s.causal else 'encoder'}), {spec.n_layers} layers "
            f"x {spec.n_heads} heads, {spec.n_kv_heads} key/value heads",
            f"text: {s.text}, {s.windows} windows of {s.window} tokens; repeated random sequences: {s.sequences} x "
            f"2 x {s.length} tokens, seed {s.seed}",
            f"relations: Spearman's ρ, {s.resamples} bootstrap resamples, {s.permutations} permutations",
            f"qkinspect {__version__}"]


def top_table(result) -> Table:
    rows = []
    for score in result.scores:
        for r in result.top(score, TOP):
            rows.append([score, f"L{r.layer} H{r.head} KV{r.kv_head}", f"{r.scores[score]:.3f}",
                         "-" if r.errors[score] is None else f"{r.errors[score]:.3f}",
                         *("-" if r.weights.get(m) is None else f"{r.weights[m]:.3f}" for m in result.settings.relate)])
    return Table(f"Strongest {TOP} heads per score", ["score", "head", "value", "se", *result.settings.relate], rows)


def relation_table(result) -> Table:
    rows = []
    for r in result.relations:
        if r.scope == "layer":
            continue
        rows.append([r.metric, r.score, r.scope, "-" if r.rho is None else f"{r.rho:+.2f}",
                     "-" if r.low is None else f"{r.low:+.2f}..{r.high:+.2f}", "-" if r.p is None else f"{r.p:.3f}",
                     str(r.n)])
    return Table("Spearman's ρ of weight metric and score", ["metric", "score", "scope", "ρ", "95 % CI", "p", "n"],
                 rows)


def pairs(result) -> list[tuple[str, str]]:
    """Each related metric with the score it relates to most strongly over all heads."""
    out = []
    for m in result.settings.relate:
        rel = [r for r in result.relations if r.metric == m and r.scope == "all" and r.rho is not None]
        if rel:
            out.append((m, max(rel, key=lambda r: abs(r.rho)).score))
    return out


def write_heads_pdf(result, buffer: IO[bytes], *, title: str | None = None) -> int:
    from matplotlib.backends.backend_pdf import PdfPages

    from qkinspect.report.pages import TextPages, figure_page
    from qkinspect.report.style import style

    with style(), PdfPages(buffer) as pdf:
        pages = TextPages(pdf.savefig, footer=f"qkinspect heads report: {result.model.name}")
        pages.heading(title or f"qkinspect heads report: {result.model.name}", 15)
        for line in facts(result):
            pages.paragraph(line)
        pages.table(top_table(result))
        pages.table(relation_table(result))
        for m, s in pairs(result):
            figure_page(pages, lambda canvas, m=m, s=s: heads_figure(result, m, s, canvas=canvas), CAPTION)
        pages.close()
        return pdf.get_pagecount()


def render_heads_html(result, *, name: str | None = None, date: dt.datetime | None = None) -> str:
    from qkinspect.report.pages import CSS, html_table, svg

    when = (date or dt.datetime.now(dt.timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    head = name or f"qkinspect heads report: {result.model.name}"
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{escape(head)}</title>"
             f"<style>{CSS}</style></head><body>", f"<h1>{escape(head)}</h1>",
             *(f"<p class='meta'>{escape(t)}</p>" for t in [*facts(result), when]),
             html_table(top_table(result)), html_table(relation_table(result)), "<h2>Figures</h2>"]
    for m, s in pairs(result):
        parts.append(f"<figure>{svg(heads_figure(result, m, s))}<figcaption>{escape(CAPTION)} "
                     f"({escape(m)} against {escape(SCORE_NAMES.get(s, s))})</figcaption></figure>")
    return "\n".join([*parts, "</body></html>"])
