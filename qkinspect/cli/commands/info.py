"""`qkinspect info`: what a checkpoint holds (blocks, shapes, positional scheme, flags, bytes of attention weights)."""

from __future__ import annotations

from typing import Any

import typer

from qkinspect.cli.options import FormatOpt, ModelArg, OutputOpt, RevisionOpt
from qkinspect.cli.output import Document, check_output, emit
from qkinspect.documents import envelope


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
    from qkinspect.analysis.info import model_info
    from qkinspect.documents import model_dict
    from qkinspect.terminal.info import render_info

    info = model_info(model, revision=revision)
    d = model_dict(info)
    rows = [_block_row(info, b) for b in d["blocks"]]
    return Document(json=envelope("info", model=d), rows=rows, render=lambda console: render_info(console, info, rows))


def _block_row(info, b: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": info.name, "model_type": info.model_type, "block": b.get("label") or b["name"],
        "kind": b["name"], "n_layers": b["n_layers"], "n_heads": b["n_heads"], "n_kv_heads": b["n_kv_heads"],
        "d_model": b["d_model"], "d_head": b["d_head"], "positional": b["positional"],
        "rotary_dims": b["rotary_dims"], "flags": " ".join(b["flags"]), "dtype": info.dtype,
    }
