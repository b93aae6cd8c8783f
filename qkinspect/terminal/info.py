"""`qkinspect info`'s table for people: what a checkpoint holds, a row per attention block."""

from __future__ import annotations

from typing import Any


def human_bytes(n: int | None) -> str:
    """1536 -> '1.5 KiB'."""
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # unreachable


def render_info(console, info, rows: list[dict[str, Any]]) -> None:
    """The model line, its source, format and bytes, and a row per block (rows: `qkinspect info`'s tidy rows)."""
    from rich.text import Text

    from qkinspect.terminal.tables import Column, fit_tables

    console.print(Text(info.name, style="bold") + Text(f"  {info.model_type}"
                                                       + (f" ({info.architecture})" if info.architecture else "")))
    # The path on a line of its own, never wrapped by us: how long it is depends on where the model lives.
    console.print(f"source: {info.source}", highlight=False, markup=False, soft_wrap=True)
    console.print(f"format: {info.format}  dtype: {info.dtype or '?'}  "
                  f"attention weights: {human_bytes(info.attention_bytes)}", highlight=False, markup=False)
    if info.quantization:
        console.print(f"quantized: {info.quantization} (dequantized on read)", highlight=False, markup=False)
    cells = {"block": [r["block"] for r in rows], "layers": [str(r["n_layers"]) for r in rows],
             "heads": [str(r["n_heads"]) for r in rows], "KV heads": [str(r["n_kv_heads"]) for r in rows],
             "d_model": [str(r["d_model"]) for r in rows], "d_head": [str(r["d_head"]) for r in rows],
             "positional": [r["positional"] + (f" ({r['rotary_dims']} dims)" if r["rotary_dims"] else "")
                            for r in rows],
             "flags": [r["flags"] or "-" for r in rows]}
    columns = [Column(k, v, left=k in ("block", "positional", "flags")) for k, v in cells.items()]
    for t in fit_tables(columns[:1], columns[1:], width=console.width):
        console.print(t)
