"""The atlas's PDF report: a cover (models, facts, failures) and the depth and size figures
(`qkinspect.report.atlas.figures`) for the metrics the atlas holds, each on a page with its caption (`depth_caption`,
`size_caption`, which the HTML report shares).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import IO

from matplotlib.figure import Figure

from qkinspect.errors import InputError
from qkinspect.report.atlas.figures import (
    LAYER_FORM,
    REPORT_METRICS,
    SIZE_METRICS,
    chance_levels,
    depth_figure,
    size_figure,
)
from qkinspect.report.style import PAGE, style
from qkinspect.report.titles import fit


def atlas_metrics(atlas) -> list[str]:
    have = atlas.metrics
    return [m for m in REPORT_METRICS if m in have] or have[:4]


def cover_lines(atlas, version: str, date: dt.datetime, title: str | None = None) -> list[tuple[str, int]]:
    opts = ", ".join(f"{k} {v}" for k, v in atlas.options.items() if v not in (None, False))
    models = {f["model"] for f in atlas.facts}
    lines = [("qkinspect atlas report", 16), *([(title, 12)] if title else []),
             (f"folder: {atlas.folder}", 10),
             (f"{len(atlas.models)} models, {len(models)} with results, {len(atlas.failures)} failed; "
              f"{len(atlas.facts)} blocks", 10),
             (f"options: {opts or 'defaults'}", 10),
             ("depth: l / (L − 1) of each block's own L (a block of one layer: 0.5); medians and quartiles over "
              "heads; the layer form pairs query head h with key head h // (heads / kv heads)", 9),
             (f"qkinspect {version}, {date:%Y-%m-%d %H:%M} UTC", 9), ("", 9), ("models and blocks:", 10)]
    chance = {(b["model"], b["block"], b["metric"]): b["mean"] for b in atlas.baselines}
    for f in atlas.facts[:70]:
        sym = atlas.summary("symmetry", f["model"], f["block"])
        qk = chance.get((f["model"], f["block"], "overlap_qk"))
        lines.append((f"  {f['model']} [{f['block']}]: {f['family']}, {f['layers']} layers, {f['heads']}:"
                      f"{f['kv_heads']} heads, d_model {f['d_model']}, d_head {f['d_head']}, {f['positional']}"
                      f"{', q/k norm' if f['qk_norm'] else ''}"
                      f"{' (measured raw, not folded)' if f.get('qk_norm_raw') else ''}, "
                      f"{f['attention_params']:,} attention parameters"
                      + (f"; symmetry median {sym.median:.3f}" if sym else "")
                      + (f"; overlap by chance {qk:.3f}" if qk is not None else ""), 7))
    if len(atlas.facts) > 70:
        lines.append((f"  … and {len(atlas.facts) - 70} more", 7))
    lines += [(f"failed: {f.name}: {f.error}"[:200], 7) for f in atlas.failures[:20]]
    lines += [(f"note: {n}", 7) for n in atlas.notes[:20]]
    return lines


def _cover(lines: list[tuple[str, int]]) -> Figure:
    fig = Figure(figsize=PAGE)
    y = 0.95
    for text, size in lines:
        for line in fit(text, PAGE[0] * 0.84, size).split("\n"):
            fig.text(0.08, y, line, fontsize=size, va="top")
            y -= size / 72 / PAGE[1] * 1.5
    return fig


def depth_caption(atlas, metric: str) -> str:
    """What a depth figure of the report shows, in words: the axes, the line and band, the chance level, the models
    measured raw."""
    if metric in LAYER_FORM:
        what = (f"{metric} of each layer's summed form Σ_h W_Q^h W_K^{{g(h)}}ᵀ, query head h paired with the "
                "key/value head g(h) = h // (heads / kv heads) it reads: one value per layer, a line per model and "
                "block.")
    else:
        what = (f"{metric}: a line per model and block through the median over each layer's heads, the band its "
                "quartiles (the middle half of the heads).")
    text = (f"{what} x: normalised depth l / (L − 1) of each block's own L layers (0 first, 1 last; a block of one "
            "layer is a point at 0.5). Panels by block kind (encoder dashed, decoder solid, cross-attention dotted); "
            "a model keeps its colour in every figure.")
    if chance_levels(atlas, metric):
        text += (" Thin dotted lines: each model's chance level, the value random weights of its shapes give "
                 "(≈ d_head / d_model for an overlap), which differs by model: read each line against its own.")
    return text + _raw_note(atlas, metric)


def size_caption(atlas, metric: str) -> str:
    over = "layers" if metric in LAYER_FORM else "heads"
    text = (f"{metric}: each model's median over its {over} (marker; shape by block kind) with its quartiles "
            "(bar), against its attention parameters (W_Q, W_K, W_V, W_O of every block, log scale); a model's "
            "blocks sit side by side.")
    if chance_levels(atlas, metric):
        text += " Ticks: each model's chance level (random weights of its shapes)."
    return text + _raw_note(atlas, metric)


def _raw_note(atlas, metric: str) -> str:
    """The q/k-norm models measured raw, where the metric depends on the q/k-norm gains (an overlap compares column
    spaces, which a gain on the head's side leaves as they are)."""
    raw = list(dict.fromkeys(f["model"] for f in atlas.facts if f.get("qk_norm_raw")))
    if not raw or metric.startswith("overlap_"):
        return ""
    shown = ", ".join(raw[:6]) + (f" and {len(raw) - 6} more" if len(raw) > 6 else "")
    return (f" Measured raw, q/k-norm gains not folded in: {shown}; their W_Q W_Kᵀ is the stored projections', not "
            "what attention computes (an atlas with --fold-qk-norm folds them).")


def write_atlas_pdf(atlas, target: str | Path | IO[bytes], *, date: dt.datetime | None = None,
                    title: str | None = None) -> int:
    """Write the atlas report as a PDF: the cover, a depth figure per metric, the size figures, each figure on a
    page of its own with its caption, as the model report places them; returns the number of pages."""
    from matplotlib.backends.backend_pdf import PdfPages

    from qkinspect.report.pages import TextPages, figure_page
    from qkinspect.version import __version__

    if not atlas.records:
        raise InputError(f"{atlas.folder}: the atlas has no results yet")
    metrics = atlas_metrics(atlas)
    sizes = [m for m in SIZE_METRICS if m in atlas.metrics]
    lines = cover_lines(atlas, __version__, date or dt.datetime.now(dt.timezone.utc), title)
    lines.insert(5, (f"figures: {', '.join(metrics)} against depth; {', '.join(sizes)} against attention "
                     "parameters", 9))
    with style(), PdfPages(target, metadata={"Title": f"qkinspect atlas report: {title or atlas.folder}"}) as pdf:
        pages = TextPages(pdf.savefig, footer=f"qkinspect atlas report: {title or atlas.folder}")
        pages.add_page(_cover(lines))
        for metric in metrics:
            figure_page(pages, lambda canvas, m=metric: depth_figure(atlas, m, canvas=canvas, name=title),
                        depth_caption(atlas, metric))
        for metric in sizes:
            figure_page(pages, lambda canvas, m=metric: size_figure(atlas, m, canvas=canvas, name=title),
                        size_caption(atlas, metric))
        pages.close()
        return pages.count
