"""`qkinspect heads`' tables for people: the strongest heads of each behaviour score beside their weight metrics,
and how each related weight metric goes with each score (Spearman's ρ over all heads and within layers, with its
bootstrap interval and permutation p-value)."""

from __future__ import annotations

from qkinspect.selection import spans
from qkinspect.terminal.tables import Column, fit_tables, fmt_value, print_lines

SHORT = {"previous_token": "prev", "induction": "induct", "duplicate_token": "dup", "self": "self",
         "first_token": "first", "entropy": "entropy"}


def head_label(r, gqa: bool) -> str:
    """"L3 H5", with its key/value head under grouped-query attention: "L3 H5 (KV1)"."""
    return f"L{r.layer} H{r.head}" + (f" (KV{r.kv_head})" if gqa else "")


def _r(x: float) -> str:
    """A correlation without its leading zero, as statistics tables print it: "+.43", "−.07", "+1.00"."""
    return f"{x:+.2f}".replace("0.", ".", 1).replace("-", "−")


def rho_cell(r) -> str:
    """"+.43 (+.02..+.72)": ρ and its 95 % bootstrap interval; "-" where undefined."""
    if r is None or r.rho is None:
        return "-"
    if r.low is None or r.high is None:
        return _r(r.rho)
    return f"{_r(r.rho)} ({_r(r.low)}..{_r(r.high)})"


def p_cell(p) -> str:
    """A p-value as the tables print it (3 decimals; "-" where there is none)."""
    return "-" if p is None else f"{p:.3f}"


def selection_words(settings) -> str:
    """The heads selected, "layers 0-1, heads 2,5" ("" when every head was scored)."""
    parts = [f"{what}{'s' if len(v) > 1 else ''} {spans(v)}"
             for what, v in (("layer", settings.layers), ("head", settings.heads)) if v]
    return ", ".join(parts)


def render_heads(console, result, top: int = 5) -> None:
    """The strongest `top` heads of each score (sections), then the relations."""
    s = result.settings
    info = result.model
    spec = info.blocks[0]
    gqa = spec.n_kv_heads < spec.n_heads
    console.print(f"{info.name} ({info.model_type}, {'causal' if s.causal else 'encoder'}): {spec.n_layers} layers x "
                  f"{spec.n_heads} heads{f', {spec.n_kv_heads} key/value heads' if gqa else ''}",
                  markup=False, highlight=False)
    shown = [m for m in s.relate if m in s.metrics] or list(s.metrics[:3])
    rows, sections, names = [], [], []
    for score in result.scores:
        if score == "entropy":
            continue
        best = result.top(score, top)
        if best:
            sections.append(len(rows))
            rows += best
            names += [score] * len(best)
    if rows:
        labels = [Column("score", [SHORT[n] for n in names], left=True),
                  Column("head", [head_label(r, gqa) for r in rows], left=True)]
        vals = [Column("value", [fmt_value(r.scores[n], 3) for r, n in zip(rows, names, strict=True)]),
                Column("± se", [fmt_value(r.errors[n], 3) for r, n in zip(rows, names, strict=True)])]
        vals += [Column(m, [fmt_value(r.weights.get(m), 3) for r in rows]) for m in shown]
        for t in fit_tables(labels, vals, width=console.width, sections=sections,
                            title=f"strongest heads per score (top {top})"):
            console.print(t)
    rel = [r for r in result.relations if r.scope in ("all", "within")]
    if rel:
        pairs = list(dict.fromkeys((r.metric, r.score) for r in rel))
        by = {(r.metric, r.score, r.scope): r for r in rel}
        labels = [Column("weight metric", [m for m, _ in pairs], left=True),
                  Column("score", [SHORT[sc] for _, sc in pairs], left=True)]
        vals = []
        for scope, name in (("all", "all heads"), ("within", "within layers")):
            got = [by.get((m, sc, scope)) for m, sc in pairs]
            vals += [Column(f"ρ {name}", [rho_cell(g) for g in got]),
                     Column("p", [p_cell(g.p) if g else "-" for g in got])]
        starts = [i for i, (m, _) in enumerate(pairs) if i == 0 or pairs[i - 1][0] != m]
        for t in fit_tables(labels, vals, width=console.width, sections=starts,
                            title="Spearman's ρ of weight metric and behaviour score"):
            console.print(t)
    n = len(result.records)
    chosen = selection_words(s)
    over = f"the {n} selected heads ({chosen})" if chosen else f"{n} heads"
    lines = [f"text: {s.text}, {s.windows} windows of {s.window} tokens; repeated: {s.sequences} sequences of "
             f"2 x {s.length} random tokens (seed {s.seed}); ± se over sequences"]
    if rel:
        lines = ["ρ (95 % CI): Spearman's rank correlation and its bootstrap interval", *lines,
                 f"ρ over {over}; within layers: ranks within each layer, pooled; CI: 95 % bootstrap over heads "
                 f"({s.resamples} resamples); p: permutation ({s.permutations}); per-layer ρ in the JSON"]
    elif chosen:
        lines.append(f"scored: the {n} selected head{'s' if n != 1 else ''} ({chosen})")
    if not s.causal:
        lines.append("an encoder: no induction score (each position sees the repeated token itself)")
    print_lines(console, lines + list(result.warnings))
