"""`qkinspect spectrum`'s table for people: one head's singular values (and eigenvalues), a bar per value."""

from __future__ import annotations

from typing import Any

from qkinspect.terminal.tables import COLUMN_GAP, Column, fit_tables, fmt_value, model_line

MATRIX_TEXT = {"qk": "W_Q W_Kᵀ", "q": "W_Q", "k": "W_K", "v": "W_V", "ov": "W_V W_O"}


def render_spectrum(console, result, h, matrix: str, rows: list[dict[str, Any]]) -> None:
    """The model line, the head and its matrix, and a row per index with a bar proportional to σ where it fits."""
    console.print(model_line(result.model, result.processing), markup=False, highlight=False)
    console.print(f"{h.block} layer {h.layer} head {h.head} (KV head {h.kv_head}): {MATRIX_TEXT[matrix]}",
                  style="bold", highlight=False)
    names = [c for c in ("index", "singular_value", "eig_real", "eig_imag", "eig_abs") if c in rows[0]]
    columns = [Column(c.replace("_", " "), [fmt_value(r.get(c), 4) for r in rows]) for c in names]
    room = console.width - sum(c.width() + COLUMN_GAP for c in columns)
    top = max((r["singular_value"] or 0.0) for r in rows) or 1.0
    bars = ["█" * round(max(0, min(20, room)) * (r["singular_value"] or 0.0) / top) for r in rows]
    if room >= 5:  # a bar proportional to the singular value, where the width allows
        columns.append(Column("", bars, left=True))
    for t in fit_tables(columns[:1], columns[1:], width=console.width):
        console.print(t)
