"""`qkinspect info`: what a checkpoint holds (blocks, shapes, positional scheme, flags, bytes of attention weights)."""

from __future__ import annotations

from typing import Any

import typer

from qkinspect.analysis.results import envelope
from qkinspect.cli.options import FormatOpt, ModelArg, OutputOpt, RevisionOpt
from qkinspect.cli.output import Document, check_output, emit


def register(app: typer.Typer) -> None:
    @app.command()
    def info(model: ModelArg = None, revision: RevisionOpt = None, fmt: FormatOpt = None,
             output: OutputOpt = None) -> None:
        """Summarise a model's attention: blocks, layers, heads, KV heads, widths, positions, flags, bytes.

        Example: qkinspect info ./my-bert --format json
        """
        check_output(fmt, output)
        emit(info_document(model, revision), fmt, output)


def info_document(model: str | None, revision: str | None = None) -> Document:
    """The model's identity and block shapes; dtype and bytes come from the checkpoint's headers (no weights read)."""
    from qkinspect.analysis.results import model_dict
    from qkinspect.loading import open_model

    with open_model(model, revision=revision) as m:
        info = m.info
    d = model_dict(info)
    rows = [_block_row(info, b) for b in d["blocks"]]
    return Document(json=envelope("info", model=d), rows=rows, render=lambda console: _render(console, info, rows))


def _block_row(info, b: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": info.name, "model_type": info.model_type, "block": b.get("label") or b["name"],
        "kind": b["name"], "n_layers": b["n_layers"], "n_heads": b["n_heads"], "n_kv_heads": b["n_kv_heads"],
        "d_model": b["d_model"], "d_head": b["d_head"], "positional": b["positional"],
        "rotary_dims": b["rotary_dims"], "flags": " ".join(b["flags"]), "dtype": info.dtype,
    }


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


def _render(console, info, rows: list[dict[str, Any]]) -> None:
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
