"""`qkinspect compare`'s table for people: per-head differences of the metrics between two checkpoints, B − A."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from qkinspect.terminal.tables import gauge_note, head_table, legend, model_line, print_lines


def render_compare(console, a, b, rows: list[dict[str, Any]], cols: list[str]) -> None:
    """Both models' lines, the per-head differences (B − A) in `cols`, their legend and each column's |Δ|."""
    console.print(f"A: {model_line(a.model, a.processing)}", markup=False, highlight=False)
    console.print(f"B: {model_line(b.model, b.processing)}", markup=False, highlight=False)
    heads = [SimpleNamespace(block=r["block"], layer=r["layer"], head=r["head"], kv_head=r["kv_head"], values=r)
             for r in rows]
    for t in head_table(heads, cols, title="per-head differences, B − A", width=console.width):
        console.print(t)
    print_lines(console, [legend(cols)])
    gauge_note(console, cols)
    for c in cols:
        vals = [abs(r[c]) for r in rows if r[c] is not None and not math.isnan(r[c])]
        if vals:
            console.print(f"{c}: mean |Δ| {sum(vals) / len(vals):.4f}, max |Δ| {max(vals):.4f}", style="dim",
                          highlight=False)
