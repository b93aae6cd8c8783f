"""`qkinspect composition`'s table for people: the strongest pairs of each kind (Q, K, V) beside the null, and the
words that say how to read them."""

from __future__ import annotations

from qkinspect.selection import spans
from qkinspect.terminal.tables import Column, fit_tables, fmt_value, print_lines


def _head(block: str, layer: int, head: int, multi: bool, heads: tuple[int, ...] | None = None) -> str:
    """"L3 H5"; a key/value head with its query heads (by kv-head): "L18 KV2 (H12-17)"."""
    short = {"encoder": "enc", "decoder": "dec", "cross": "cross"}.get(block, block)
    unit = f"H{head}" if heads is None else f"KV{head} (H{spans(heads)})"
    return f"{short + ' ' if multi else ''}L{layer} {unit}"


KIND_TITLE = {"q": "Q-composition: a writes what b's queries read",
              "k": "K-composition: a writes what b's keys read",
              "v": "V-composition: a writes what b's values read"}


def render_composition(console, result, top: int = 10) -> None:
    """`qkinspect composition`'s table: the `top` strongest pairs of each kind, beside the null."""
    p = result.processing
    info = result.model
    console.print(f"{info.name} ({info.model_type})  [{p.precision}"
                  f"{', fold_ln' if p.fold_ln else ''}{', fold_qk_norm' if p.fold_qk_norm else ''}]",
                  markup=False, highlight=False)
    multi = result.multi_block
    for kind in p.kinds:
        recs = result.top(kind, top)
        if not recs:
            continue
        cols = [Column("earlier a", [_head(r.from_block, r.from_layer, r.from_head, multi) for r in recs], left=True),
                Column("later b", [_head(r.to_block, r.to_layer, r.to_head, multi, r.to_heads) for r in recs],
                       left=True)]
        vals = [Column("score", [fmt_value(r.score, 4) for r in recs]),
                Column("null", [fmt_value(r.baseline, 4) for r in recs]),
                Column("ratio", [fmt_value(r.ratio, 2) for r in recs])]
        for t in fit_tables(cols, vals, width=console.width, title=f"{KIND_TITLE[kind]} (top {len(recs)})"):
            console.print(t)
    lines = ["null = 1/√d_model, the RMS score of random Gaussian heads; ratio = score / null"]
    if result.by_kv:
        lines.append("by key/value head: b is a key/value head KVg with its query heads (H…) stacked side by side, "
                     "each weighted by its own ‖W_QK‖² (q, k) or ‖W_OV‖² (v); under multi-head attention the same "
                     "as by head")
    elif any(b.n_kv_heads < b.n_heads for b in info.blocks) and any(k in p.kinds for k in ("k", "v")):
        lines.append("grouped-query attention: the query heads of one key/value head share its keys and values, so "
                     "their K and V scores are nearly alike; --by kv-head gives one row per key/value head")
    if multi:
        lines += [f"{q.from_block} -> {q.to_block} ({','.join(q.kinds)}): {q.rule}" for q in result.pairs]
    print_lines(console, lines)
