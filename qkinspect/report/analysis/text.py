"""The report's words: cover, summary page, definitions, figure captions and the tables' introduction."""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict

from qkinspect.analysis.results import AnalysisResult
from qkinspect.report.analysis.summary import Section
from qkinspect.report.pages import TextPages
from qkinspect.report.style import NUMBER_NOTE
from qkinspect.report.tables import Table
from qkinspect.version import __version__

CAPTIONS = {
    "symmetry": "Symmetry score s = ⟨M, Mᵀ⟩ / ‖M‖² of M = W_Q W_Kᵀ for every head (rows: layers, columns: heads). "
                "Red: M is close to symmetric (a query attends to a key as the key would to the query; s = 1 "
                "when queries and keys share one matrix); blue: antisymmetric; white: no preference, as for "
                "unrelated random W_Q and W_K. The colour scale is centred at 0 and fitted to the largest |s|; "
                "grey cells were not analysed or are undefined.",
    "distribution": "Histogram of the symmetry scores of all heads of each block (red; the vertical red line is the "
                    "median) against the random baseline: the same score for Gaussian W_Q and W_K of the same "
                    "shapes (dashed line: its mean; grey band: mean ± 3 standard deviations). Heads outside the "
                    "band are more (or less) symmetric than chance.",
    "overlap": "Overlap of the column spaces of W_Q and W_K (Q / K), W_Q and W_V (Q / V), and W_K and W_V (K / V) "
               "per head: the mean cos² of the principal angles between the two d_head-dimensional subspaces of "
               "the d_model-dimensional input, 1 when they coincide. It does not change under W_Q → W_Q G, "
               "W_K → W_K G⁻ᵀ. All panels share one colour scale; each panel's title gives the random baseline.",
    "rank": "How many dimensions of its d_head each head's W_Q W_Kᵀ really uses, by layer. Effective rank: "
            "exp of the entropy of the normalised singular values (Roy & Vetterli); stable rank: ‖M‖²_F / σ₁²; "
            "k90: the number of singular values holding 90% of the squared-singular-value energy. Dots: median "
            "over heads; thick bars: the middle half of the heads; thin bars: all heads; dashed: d_head.",
    "spectra": "Singular values of W_Q W_Kᵀ for every head, divided by the largest, on a log scale; one panel "
               "per layer, one line per head (colour: head index), the median over heads in black. At most d_head "
               "singular values are non-zero (dotted line). A fast fall means the head's scores depend on few "
               "directions of the input.",
    "heads": "Within each layer, the overlap between the query subspaces of every pair of heads (mean cos² of "
             "principal angles). Bright off-diagonal cells are heads that read the same directions of the input; "
             "the diagonal (always 1) is grey so that it does not set the colour scale. The black line on the colour "
             "bar is chance: two random d_head-dimensional subspaces overlap by d_head / d_model on average.",
}


COVER_INTRO = "The query-key geometry of the model's attention heads, measured from its weights alone."


def cover(pages: TextPages, result: AnalysisResult, date: dt.datetime) -> None:
    """Model identity, shapes of each block, processing flags, tool version and date, under the title report_pdf
    sets (the model's name, or a report's --title)."""
    m = result.model
    pages.pairs([("model", m.name), ("source", m.source), ("model type", m.model_type),
                 ("architecture", m.architecture or "n/a"), ("format", m.format), ("revision", m.revision or "n/a"),
                 ("storage dtype", m.dtype or "n/a"),
                 ("attention weights", f"{m.attention_bytes:,} bytes" if m.attention_bytes else "n/a")])
    t = blocks_table(result)  # the flags (several words) below the table: a column of theirs overprints its neighbours
    pages.table(Table(t.title, t.header[:-1], [r[:-1] for r in t.rows]), min_column=0.7)
    pages.pairs([(f"{r[0]} flags", r[-1]) for r in t.rows])
    pages.heading("Processing", size=11)
    pages.pairs(processing_pairs(result))
    from qkinspect.report.analysis.summary import qk_norm_notice

    if notice := qk_norm_notice(result):
        pages.paragraph(notice, color="#a00000")
    pages.heading("This report", size=11)
    n_heads = len(result.heads)
    pages.pairs([("tool", f"qkinspect {__version__}"), ("date", date.strftime("%Y-%m-%d %H:%M %Z").strip()),
                 ("heads analysed", str(n_heads)),
                 ("metrics", f"{len(result.metric_names)} computed; the {_n_shown(result)} this report shows are "
                             "defined on the Definitions pages"),
                 ("warnings", str(len(result.warnings))), ("numbers", NUMBER_NOTE)])


def _n_shown(result: AnalysisResult) -> int:
    from qkinspect.report.analysis.tables import shown_metrics

    return len(shown_metrics(result))


def blocks_table(result: AnalysisResult) -> Table:
    rows = [[b.key, str(b.n_layers), str(b.n_heads), str(b.n_kv_heads), str(b.d_model), str(b.d_head),
             b.positional, str(b.rotary_dims) if b.rotary_dims else "-", ", ".join(b.flags()) or "-"]
            for b in result.model.blocks]  # rotary dims in a column of their own: right-aligned cells never touch
    header = ["block", "layers", "heads", "kv heads", "d_model", "d_head", "positions", "rotary dims", "flags"]
    return Table("Attention blocks", header, rows)


def processing_pairs(result: AnalysisResult) -> list[tuple[str, str]]:
    """The processing record as (name, words) for a cover: selections as lists ("all" when none was made), flags as
    yes/no, and the q/k-norm row only for a model that has q/k norms measured raw (empty, it said nothing)."""
    out = []
    for k, v in asdict(result.processing).items():
        if k == "metrics" or (k == "qk_norm_not_folded" and not v):
            continue
        if v is None:
            words = "all" if k in ("blocks", "layers", "heads") else "no"  # dequantized None: not dequantized
        elif isinstance(v, bool):
            words = "yes" if v else "no"
        elif isinstance(v, (list, tuple)):
            words = ", ".join(map(str, v))
        else:
            words = str(v)
        out.append((k, words))
    return out


def summary_page(pages: TextPages, result: AnalysisResult, sections: list[Section]) -> None:
    pages.heading("Summary")
    pages.paragraph(f"What the weights of {result.model.name} say about its attention heads, in plain words. "
                    "The figures and tables that follow give every head and layer.", color="0.25")
    size = 9.5 if len(sections) <= 2 else 8.8  # several blocks: a smaller font keeps the summary on one page
    for s in sections:
        pages.heading(s.title, size=10.5)
        for p in s.paragraphs:
            pages.paragraph(p, size=size)


def definitions(pages: TextPages, result: AnalysisResult) -> None:
    """Each reported metric: name, range, whether it survives the gauge freedom, and what it measures."""
    pages.heading("Definitions")
    pages.paragraph("For head h, M = W_Q W_Kᵀ (d_model × d_model, rank ≤ d_head) is the bilinear form of the "
                    "attention scores: score(x_i, x_j) = x_i M x_jᵀ (before biases and the 1/√d_head scale). "
                    "W_Q → W_Q G, W_K → W_K G⁻ᵀ leaves every score unchanged for any invertible G; only "
                    "quantities invariant under this gauge describe the model rather than its parametrisation, "
                    "and each definition says which it is.", color="0.25")
    from qkinspect.report.analysis.tables import shown_metrics

    for d in metric_definitions(shown_metrics(result)):
        pages.heading(d["name"], size=10)
        facts = [f"range {d['range']}" if d.get("range") else "", gauge_words(d.get("gauge_invariant")),
                 f"undefined (n/a) unless {d['requires']}" if d.get("requires") else "",
                 d.get("reference") or ""]
        pages.paragraph("; ".join(f for f in facts if f), size=8.5, color="0.3")
        pages.paragraph(d.get("description", ""), size=9)


GAUGE_WORDS = {
    "yes": "gauge-invariant (describes the model)",
    "orthogonal": "invariant under orthogonal re-basings only (depends on the parametrisation)",
    "no": "not gauge-invariant (depends on the basis)",
}


def gauge_words(value) -> str:
    """The registry's gauge field ("yes", "orthogonal", "no") in words.

    Example:
        >>> gauge_words("orthogonal")
        'invariant under orthogonal re-basings only (depends on the parametrisation)'
    """
    if value is None or value == "":
        return ""
    if isinstance(value, bool):
        value = "yes" if value else "no"
    return GAUGE_WORDS.get(str(value), f"gauge invariance: {value}")


def metric_definitions(names: list[str]) -> list[dict]:
    """The metrics registry's definitions as a list of dicts with name, description, range, gauge_invariant."""
    from qkinspect.metrics.registry import definitions as registry_definitions

    raw = registry_definitions(list(names))
    items = raw.items() if isinstance(raw, dict) else ((getattr(d, "name", None) or d["name"], d) for d in raw)
    out = []
    for name, d in items:
        d = d if isinstance(d, dict) else asdict(d)
        rng = d.get("range")
        out.append({**d, "name": name, "range": _range(rng)})
    return out


def _range(rng) -> str:
    if rng is None:
        return ""
    if isinstance(rng, (list, tuple)) and len(rng) == 2:
        return f"[{rng[0]}, {rng[1]}]"
    return str(rng)


def tables_intro(pages: TextPages, skipped: list[str]) -> None:
    pages.heading("Per-layer tables")
    pages.paragraph("Layer records as the analysis reports them (summaries over each layer's heads, and the "
                    f"layer's summed form when it was asked for), then per-layer medians over heads. {NUMBER_NOTE}",
                    color="0.25")
    if skipped:
        pages.paragraph("Figures left out: " + "; ".join(skipped), color="0.25")
