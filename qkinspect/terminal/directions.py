"""`qkinspect directions`' table for people: per head, side, direction (or subspace), σ, sign and its tokens, cut to
the console's width; the readout's words under it."""

from __future__ import annotations

from typing import Any

from qkinspect.terminal.tables import model_line, print_lines

SIDE_LABEL = {"read": "OV read", "write": "OV write", "query": "QK query", "key": "QK key"}


def span(indices) -> str:
    """(3,) -> "3"; (1, 2, 3) -> "1-3"."""
    return str(indices[0]) if len(indices) == 1 else f"{indices[0]}-{indices[-1]}"


def render_directions(console, result) -> None:
    """`qkinspect directions`' table: per head, side, direction (or subspace), σ, sign and its tokens, cut to the
    console's width."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from qkinspect.loading.tokens import printable

    console.print(model_line(result.model), markup=False, highlight=False)
    by_head: dict[tuple, list[Any]] = {}
    for r in result.records:
        by_head.setdefault((r.block, r.layer, r.head, r.kv_head), []).append(r)
    for (blk, layer, head, kv), recs in by_head.items():
        t = Table(header_style="bold", show_edge=False, pad_edge=False, box=box.SIMPLE_HEAVY, padding=(0, 1, 0, 0),
                  width=console.width)
        t.add_column("side", no_wrap=True)
        t.add_column("dir", justify="right", no_wrap=True)
        t.add_column("σ", justify="right", no_wrap=True)
        t.add_column("±", no_wrap=True)
        t.add_column("tokens (␣ = space; ids with --format json)", no_wrap=True, overflow="ellipsis", ratio=1)
        last = None
        for r in recs:
            if last is not None and (r.matrix, r.side) != last:
                t.add_section()
            shown = " ".join(printable(x) if x is not None else f"#{i}" for x, i in zip(r.tokens, r.token_ids,
                                                                                       strict=True))
            t.add_row(SIDE_LABEL[r.side] if (r.matrix, r.side) != last else "",
                      span(r.indices) + ("+" if r.cut else ""), f"{r.sigma:.3g}", r.sign, Text(shown))
            last = (r.matrix, r.side)
        console.print(Text(f"{blk} layer {layer} head {head} (KV head {kv})", style="italic"))
        console.print(t)
    rd = result.readout
    read = f"write side: {rd.unembedding}" + ("" if rd.tied else " (untied)") + \
        (f" with {rd.final_norm}'s gain folded" if rd.final_norm else "")
    cut = ["dir a-b+: the near-equal run goes on past b (a run grows at most K directions past the K asked for)"]
    print_lines(console, [f"{read}; read, query and key sides: {rd.embedding}",
                          "a subspace (dir a-b, ±): near-equal σ, its tokens by the norm of their projection",
                          *(cut if any(r.cut for r in result.records) else []), *result.notes])
