"""`qkinspect atlas`'s table for people: a row per model and block, its shape and the medians of the seeds' metrics
beside the overlaps' chance level (the records hold every metric)."""

from __future__ import annotations

from typing import Any

from qkinspect.terminal.tables import Column, fit_tables, fmt_value, legend, print_lines, short_name

POSITIONAL = {"absolute": "abs", "relative": "rel"}
# The table answers the seeds' questions (symmetry, Q/K/V similarity); every metric is in the records.
TABLE_METRICS = ("symmetry", "symmetry_layer", "overlap_qk", "overlap_qv", "overlap_kv")


def render_atlas(console, result, *, vs_chance: bool = False) -> None:
    tables, lines = atlas_tables(result.rows(), width=console.width, vs_chance=vs_chance)
    for t in tables:
        console.print(t)
    print_lines(console, lines)


def atlas_tables(rows: list[dict[str, Any]], *, width: int = 80, vs_chance: bool = False) -> tuple[list, list[str]]:
    """A row per model and block: its layers, heads, positions and attention parameters, then the medians of the
    seeds' metrics with the overlaps' chance level (d_model, d_head and the rest are in the records and facts; with
    `vs_chance` the overlaps are ratios to it); a block with q/k norms measured raw is marked `*`; model names wider
    than a quarter of `width` are numbered, the numbers spelt out in the returned lines (with the legend)."""
    names = list(dict.fromkeys(r["model"] for r in rows))
    numbered = max(map(len, names), default=0) > width // 4
    ids = {n: str(i + 1) for i, n in enumerate(names)}
    labels = [Column("#" if numbered else "model", [ids[r["model"]] if numbered else r["model"] for r in rows],
                     left=not numbered),
              Column("block", [r["block"] + ("*" if r.get("qk_norm_raw") else "") for r in rows], left=True)]
    values = [Column("L", [str(r["layers"]) for r in rows]),
              Column("H:kv", [f"{r['heads']}:{r['kv_heads']}" for r in rows]),
              Column("pos", [POSITIONAL.get(r["positional"], str(r["positional"])) for r in rows], left=True),
              Column("params", [_count(r["attention_params"]) for r in rows])]
    shown = [m for m in TABLE_METRICS if any(r.get(m) is not None for r in rows)]
    overlaps = [m for m in shown if m.startswith("overlap_")]
    for m in shown:
        cells = [fmt_value(_over(r.get(m), r.get(f"{m}_chance")) if vs_chance and m in overlaps else r.get(m))
                 for r in rows]
        values.append(Column(short_name(m) + ("/ch" if vs_chance and m in overlaps else ""), cells))
    chance = next((f"{m}_chance" for m in overlaps if any(r.get(f"{m}_chance") is not None for r in rows)), None)
    if chance:
        values.append(Column("chance", [fmt_value(r.get(chance)) for r in rows]))
    several = len(rows) > len(names)  # a model of several blocks: a rule between models
    sections = [i for i in range(1, len(rows)) if several and rows[i]["model"] != rows[i - 1]["model"]]
    lines = [
        "medians over each block's heads (sym_sum: the layer form's, over layers); L layers, H:kv query and "
        "key/value heads, params attention weights; widths, quartiles and per-layer medians: -o FILE",
        legend(shown)]
    if chance:
        lines.append("chance: the Q/K overlap of random weights of the block's shapes (≈ d_head / d_model), the "
                     "level an overlap is read against; " + ("ovl_*/ch: each overlap over its own chance level"
                                                             if vs_chance else "--vs-chance shows the overlaps as "
                                                             "ratios to it") + "; every chance level: -o FILE")
    if any(r.get("qk_norm_raw") for r in rows):
        lines.append("* q/k norms not folded: measured raw (the stored projections' W_Q W_Kᵀ), not what attention "
                     "computes; --fold-qk-norm folds the gains")
    if numbered:
        lines.append("models: " + ", ".join(f"{ids[n]}={n}" for n in names))
    return fit_tables(labels, values, width=width, sections=sections), lines


def _over(value: float | None, chance: float | None) -> float | None:
    return value / chance if value is not None and chance else None


def _count(n: int) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def render_relations(console, result) -> None:
    """`atlas --relations`: how each weight metric relates to each behaviour score, model by model, side by side
    (Spearman's ρ with its 95 % bootstrap interval and permutation p, over all heads and within layers)."""
    tables, lines = relation_tables(result.relations, width=console.width)
    for t in tables:
        console.print(t)
    print_lines(console, lines)


def relation_tables(relations: list, *, width: int = 80) -> tuple[list, list[str]]:
    """A row per model, block, weight metric and score: ρ (interval) and p over all heads and within layers; the
    models numbered (spelt out below) and the metrics and scores by their short names, so that it fits `width`
    (80 columns in one table)."""
    from qkinspect.terminal.heads import SHORT, p_cell, rho_cell

    if not relations:
        return [], ["no relations: the atlas has no behaviour scores (atlas --behaviour, or heads documents "
                    "among its models)"]
    keys = list(dict.fromkeys((r.model, r.block, r.metric, r.score) for r in relations))
    by = {(r.model, r.block, r.metric, r.score, r.scope): r for r in relations}
    names = list(dict.fromkeys(k[0] for k in keys))
    ids = {n: str(i + 1) for i, n in enumerate(names)}
    several = len({(k[0], k[1]) for k in keys}) > len(names)
    labels = [Column("#", [ids[m] + (f" {b}" if several else "") for m, b, _, _ in keys], left=True),
              Column("metric", [short_name(x) for _, _, x, _ in keys], left=True),
              Column("score", [SHORT.get(s, s) for *_, s in keys], left=True)]
    values = []
    for scope, name in (("all", "all heads"), ("within", "within layers")):
        got = [by.get((*k, scope)) for k in keys]
        values += [Column(f"ρ {name}", [rho_cell(g) for g in got]),
                   Column("p", [p_cell(g.p) if g else "-" for g in got])]
    sections = [i for i in range(1, len(keys)) if keys[i][:3] != keys[i - 1][:3]]
    metrics = list(dict.fromkeys(k[2] for k in keys))
    lines = ["ρ (95 % CI): Spearman's rank correlation of a weight metric and a behaviour score over a model's "
             "heads, its 95 % bootstrap interval; p: permutation; within layers: ranks within each layer, pooled",
             legend(metrics).replace("columns:", "metrics:"),
             "scores: " + ", ".join(f"{SHORT[s]}={s}" for s in SHORT if SHORT[s] != s),
             "models: " + ", ".join(f"{ids[n]}={n}" for n in names)]
    return fit_tables(labels, values, width=width, sections=sections,
                      title="weight metric and behaviour score, per model"), [x for x in lines if x]
