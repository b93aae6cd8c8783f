"""The report as one self-contained HTML file: the same words, figures (inline SVG) and tables as the PDF.

Example:
    >>> import qkinspect
    >>> from qkinspect.report.analysis.html import render_html
    >>> page = render_html(qkinspect.analyze(None, metrics=["default", "head_overlap"]))
"""

from __future__ import annotations

import datetime as dt
import io
from html import escape

from qkinspect.analysis.results import AnalysisResult
from qkinspect.errors import InputError
from qkinspect.report.analysis.arrays import renamed
from qkinspect.report.analysis.figures import figure
from qkinspect.report.analysis.pdf import plan_figures
from qkinspect.report.analysis.summary import summary
from qkinspect.report.analysis.tables import layer_tables
from qkinspect.report.analysis.text import blocks_table, gauge_words, metric_definitions, processing_pairs
from qkinspect.report.style import NUMBER_NOTE, style
from qkinspect.report.tables import Table
from qkinspect.version import __version__

CSS = """body{font-family:"DejaVu Sans",sans-serif;max-width:60em;margin:2em auto;padding:0 1em;line-height:1.45}
table{border-collapse:collapse;margin:.5em 0 1.5em}th,td{padding:.15em .7em;text-align:right}
th:first-child,td:first-child{text-align:left}th{border-bottom:1px solid #888}td{font-family:monospace}
figure{margin:2em 0}figcaption{font-size:.9em;color:#333}.meta{color:#555}svg{max-width:100%;height:auto}"""


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
             *(_table(t) for t in layer_tables(result)), "</body></html>"]
    return "\n".join(parts)


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
    parts.append(_table(Table("Checkpoints", ["step", "checkpoint", "result"], rows)))
    if sweep.failures:
        parts.append(_table(Table("Failures", ["checkpoint", "error"], [[f.name, f.error] for f in sweep.failures])))
    parts.append("<h2>Figures</h2>")
    for metric in metrics:
        fig = sweep_trajectory(sweep, metric, name=name)
        parts.append(f"<figure>{_svg(fig)}<figcaption>{escape(caption(sweep, metric))}</figcaption></figure>")
    return "\n".join([*parts, "</body></html>"])


def render_atlas_html(atlas, *, date: dt.datetime | None = None, name: str | None = None) -> str:
    """An atlas's report (qkinspect.zoo.read_atlas) as one HTML string: what it holds, a table of every model and
    block (shape and medians), failures and notes, and the depth and size figures (inline SVG), as in the PDF."""
    from qkinspect.report.atlas import (
        SIZE_METRICS,
        atlas_metrics,
        depth_caption,
        depth_figure,
        size_caption,
        size_figure,
    )
    from qkinspect.report.style import fmt

    if not atlas.records:
        raise InputError(f"{atlas.folder}: the atlas has no results yet")
    metrics, sizes = atlas_metrics(atlas), [m for m in SIZE_METRICS if m in atlas.metrics]
    when = (date or dt.datetime.now(dt.timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    facts = [f"folder: {atlas.folder}", f"{len(atlas.models)} models, {len({f['model'] for f in atlas.facts})} with "
             f"results, {len(atlas.failures)} failed; {len(atlas.facts)} blocks",
             "depth: l / (L − 1) of each block's own L (a block of one layer: 0.5); medians and quartiles over heads; "
             "the layer form pairs query head h with key head h // (heads / kv heads)",
             f"qkinspect {__version__}, {when}"]
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>qkinspect atlas report: "
             f"{escape(name or str(atlas.folder))}</title><style>{CSS}</style></head><body>",
             f"<h1>{escape('qkinspect atlas report' + (': ' + name if name else ''))}</h1>",
             *(f"<p class='meta'>{escape(text)}</p>" for text in facts)]
    shown = [m for m in ("symmetry", "symmetry_layer", "overlap_qk", "overlap_qv", "overlap_kv") if m in atlas.metrics]
    rows = [[r["model"], r["block"] + (" (q/k norm raw)" if r.get("qk_norm_raw") else ""), str(r["family"]),
             str(r["layers"]), f"{r['heads']}:{r['kv_heads']}", str(r["d_model"]), str(r["d_head"]),
             str(r["positional"]), f"{r['attention_params']:,}", *(fmt(r.get(m)) for m in shown),
             fmt(r.get("overlap_qk_chance"))] for r in atlas.rows()]
    header = ["model", "block", "family", "layers", "heads:kv", "d_model", "d_head", "positional",
              "attention params", *shown, "overlap by chance"]
    parts.append(_table(Table("Models (medians over heads; the layer form's over layers)", header, rows)))
    if atlas.failures:
        parts.append(_table(Table("Failures", ["model", "error"], [[f.name, f.error] for f in atlas.failures])))
    parts += [f"<p class='meta'>note: {escape(n)}</p>" for n in atlas.notes]
    parts.append("<h2>Figures</h2>")
    for metric in metrics:
        parts.append(f"<figure>{_svg(depth_figure(atlas, metric, name=name))}<figcaption>"
                     f"{escape(depth_caption(atlas, metric))}</figcaption></figure>")
    for metric in sizes:
        parts.append(f"<figure>{_svg(size_figure(atlas, metric, name=name))}<figcaption>"
                     f"{escape(size_caption(atlas, metric))}</figcaption></figure>")
    return "\n".join([*parts, "</body></html>"])


def render_twin_html(twin, *, date: dt.datetime | None = None, name: str | None = None) -> str:
    """A twin folder's report (qkinspect.twin.saved.read_twin) as one HTML string: the setup and its scale, the
    summary in words and as a table, the learning-rate sweep, every run and failure, and the figures (inline SVG)
    with their captions, as in the PDF; `name` (a --title) names the twins."""
    from qkinspect.report.style import new_figure
    from qkinspect.report.twin.figures import twin_name
    from qkinspect.report.twin.pdf import (
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
             _table(Table("Setup", ["", ""], [list(p) for p in pairs])),
             f"<p><b>{escape(scale_caveat(twin))}</b></p>", "<h2>Summary</h2>",
             *(f"<p>{escape(line)}</p>" for line in verdict_words(twin)), _table(summary_table(twin)),
             f"<p class='meta'>{escape(NUMBER_NOTE)}</p>"]
    parts += [_table(t) for t in (lr_table(twin), failures_table(twin)) if t is not None]
    parts += [f"<p class='meta'>note: {escape(n)}</p>" for n in twin.notes]
    parts += [_table(runs_table(twin)), "<h2>Figures</h2>"]
    for draw, caption in figure_plan(twin, name):
        parts.append(f"<figure>{_svg(draw(new_figure))}<figcaption>{escape(caption)}</figcaption></figure>")
    return "\n".join([*parts, "</body></html>"])


def _svg(fig) -> str:
    """A matplotlib figure as inline SVG (no XML prolog or doctype: it sits inside HTML)."""
    buf = io.StringIO()
    with style():
        fig.savefig(buf, format="svg")
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]


def _cover(result: AnalysisResult, date: dt.datetime) -> str:
    m = result.model
    ident = [("source", m.source), ("model type", m.model_type), ("architecture", m.architecture or "n/a"),
             ("format", m.format), ("revision", m.revision or "n/a"), ("storage dtype", m.dtype or "n/a"),
             ("tool", f"qkinspect {__version__}"), ("date", date.strftime("%Y-%m-%d %H:%M %Z").strip()),
             ("heads analysed", str(len(result.heads)))]
    proc = processing_pairs(result)
    return (_table(Table("Model", ["", ""], [list(p) for p in ident])) + _table(blocks_table(result))
            + _table(Table("Processing", ["", ""], [list(p) for p in proc])))


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
        out.append(f"<figure>{_svg(fig)}<figcaption>{escape(plan.caption)}</figcaption></figure>")
    return "\n".join(out)


def _table(t: Table) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in t.header)
    rows = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in t.rows)
    return f"<h3>{escape(t.title)}</h3><table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
