"""An atlas's HTML report: what it holds, a table of every model and block (shape and medians), failures and notes,
and the depth and size figures (inline SVG), as in the PDF (`qkinspect.report.atlas.pdf`)."""

from __future__ import annotations

import datetime as dt
from html import escape

from qkinspect.errors import InputError
from qkinspect.report.pages import CSS, html_table, svg
from qkinspect.report.tables import Table
from qkinspect.version import __version__


def render_atlas_html(atlas, *, date: dt.datetime | None = None, name: str | None = None) -> str:
    """An atlas's report (qkinspect.atlas.read_atlas) as one HTML string: what it holds, a table of every model and
    block (shape and medians), failures and notes, and the depth and size figures (inline SVG), as in the PDF."""
    from qkinspect.report.atlas.figures import SIZE_METRICS, depth_figure, size_figure
    from qkinspect.report.atlas.pdf import (
        atlas_metrics,
        depth_caption,
        size_caption,
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
    parts.append(html_table(Table("Models (medians over heads; the layer form's over layers)", header, rows)))
    if atlas.failures:
        parts.append(html_table(Table("Failures", ["model", "error"], [[f.name, f.error] for f in atlas.failures])))
    parts += [f"<p class='meta'>note: {escape(n)}</p>" for n in atlas.notes]
    parts.append("<h2>Figures</h2>")
    for metric in metrics:
        parts.append(f"<figure>{svg(depth_figure(atlas, metric, name=name))}<figcaption>"
                     f"{escape(depth_caption(atlas, metric))}</figcaption></figure>")
    for metric in sizes:
        parts.append(f"<figure>{svg(size_figure(atlas, metric, name=name))}<figcaption>"
                     f"{escape(size_caption(atlas, metric))}</figcaption></figure>")
    return "\n".join([*parts, "</body></html>"])
