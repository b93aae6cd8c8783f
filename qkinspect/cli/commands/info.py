"""`qkinspect info`: what a checkpoint holds (blocks, shapes, positional scheme, flags, bytes of attention weights)."""

from __future__ import annotations

import dataclasses
from typing import Any

import typer

from qkinspect.cli.options import FormatOpt, ModelArg, OutputOpt, RevisionOpt
from qkinspect.cli.output import Document, check_writable, emit, envelope, progress


def register(app: typer.Typer) -> None:
    @app.command()
    def info(model: ModelArg = None, revision: RevisionOpt = None, fmt: FormatOpt = None,
             output: OutputOpt = None) -> None:
        """Summarise a model's attention: blocks, layers, heads, KV heads, widths, positions, flags, bytes.

        Example: qkinspect info ./my-bert --format json
        """
        if output is not None:
            check_writable(output)
        emit(info_document(model, revision), fmt, output)


def info_document(model: str | None, revision: str | None = None) -> Document:
    from qkinspect.loading import open_model
    from qkinspect.records import model_dict

    with open_model(model, revision=revision) as m:
        info, per_block = _with_sizes(m)
    d = model_dict(info)
    rows = [_block_row(info, b, per_block.get(s.key)) for b, s in zip(d["blocks"], info.blocks, strict=True)]
    return Document(json=envelope("info", model=d, attention_bytes_by_block=per_block), rows=rows,
                    render=lambda console: _render(console, info, rows))


def _with_sizes(m) -> tuple[Any, dict[str, int]]:
    """Fill in attention bytes and storage dtype, reading one layer at a time when the loader did not."""
    info = m.info
    per_block: dict[str, int] = {}
    if info.attention_bytes is not None and info.dtype is not None:
        return info, per_block
    dtype = info.dtype
    plan = [(b.key, i) for b in info.blocks for i in range(1 if b.shared_layers else b.n_layers)]
    with progress("reading attention weights") as p:
        for done, (block, i) in enumerate(plan, 1):
            layer = m.layer(block, i)
            per_block[block] = per_block.get(block, 0) + layer.nbytes()
            dtype = dtype or str(layer.W_Q.dtype).removeprefix("torch.")
            p(done, len(plan))
    return dataclasses.replace(info, attention_bytes=sum(per_block.values()), dtype=dtype), per_block


def _block_row(info, b: dict[str, Any], nbytes: int | None) -> dict[str, Any]:
    return {
        "model": info.name, "model_type": info.model_type, "block": b.get("label") or b["name"],
        "kind": b["name"], "n_layers": b["n_layers"],
        "n_heads": b["n_heads"], "n_kv_heads": b["n_kv_heads"], "d_model": b["d_model"], "d_head": b["d_head"],
        "positional": b["positional"], "rotary_dims": b["rotary_dims"], "flags": " ".join(b["flags"]),
        "attention_bytes": nbytes,
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
    from rich.table import Table

    console.print(f"[bold]{info.name}[/bold]  {info.model_type}"
                  + (f" ({info.architecture})" if info.architecture else ""))
    console.print(f"source: {info.source}  format: {info.format}  dtype: {info.dtype or '?'}  "
                  f"attention weights: {human_bytes(info.attention_bytes)}", highlight=False, soft_wrap=True)
    t = Table(show_edge=False, header_style="bold")
    for col in ("block", "layers", "heads", "KV heads", "d_model", "d_head", "positional", "flags", "bytes"):
        t.add_column(col, justify="left" if col in ("block", "positional", "flags") else "right")
    for r in rows:
        pos = r["positional"] + (f" ({r['rotary_dims']} dims)" if r["rotary_dims"] else "")
        t.add_row(r["block"], str(r["n_layers"]), str(r["n_heads"]), str(r["n_kv_heads"]), str(r["d_model"]),
                  str(r["d_head"]), pos, r["flags"] or "-", human_bytes(r["attention_bytes"]))
    console.print(t)
