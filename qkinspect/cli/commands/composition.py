"""`qkinspect composition`: Q-, K- and V-composition scores between every earlier and later head, beside their null."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from qkinspect.cli.options import (
    BlockOpt,
    Device,
    DeviceOpt,
    FoldQkNormOpt,
    HeadsOpt,
    LayersOpt,
    ModelArg,
    OutputOpt,
    Precision,
    PrecisionOpt,
    RecordFormat,
    RevisionOpt,
)
from qkinspect.cli.output import Document, emit, note, progress, warn
from qkinspect.errors import InputError

FormatOpt = Annotated[RecordFormat | None, typer.Option(
    "--format", "-f", show_default=False, metavar="FORMAT",
    help="Output format: table, json, ndjson, csv or parquet; default: from -o's extension (.parquet too), else table "
         "on a terminal and json in a pipe.")]
KindsOpt = Annotated[list[str] | None, typer.Option(
    "--kinds", metavar="KINDS", help="Which compositions: q, k, v, comma-separated or repeated (default: all).")]
TopOpt = Annotated[int, typer.Option("--top", metavar="N", help="Table: the N strongest pairs per kind.")]
FoldOpt = Annotated[bool, typer.Option(
    "--fold-ln/--no-fold-ln",
    help="Fold each layer's input-norm gain into W_Q, W_K, W_V (the default), or measure the weights as stored.")]
FromLayersOpt = Annotated[str | None, typer.Option(
    "--from-layers", metavar="LIST", help="Earlier (writing) layers, e.g. 0-3 (default: --layers).")]
ToLayersOpt = Annotated[str | None, typer.Option(
    "--to-layers", metavar="LIST", help="Later (reading) layers (default: --layers).")]
FromHeadsOpt = Annotated[str | None, typer.Option(
    "--from-heads", metavar="LIST", help="Earlier heads (default: --heads).")]
ToHeadsOpt = Annotated[str | None, typer.Option("--to-heads", metavar="LIST", help="Later heads (default: --heads).")]


class By(str, Enum):
    head = "head"
    kv_head = "kv-head"


ByOpt = Annotated[By, typer.Option(
    "--by", metavar="UNIT",
    help="The later side by query head (head, the default) or by key/value head (kv-head: one row per key/value "
         "head, its query heads named and taken together; under grouped-query attention a group's query heads "
         "score nearly alike).")]


def register(app: typer.Typer) -> None:
    @app.command()
    def composition(
        model: ModelArg = None, kinds: KindsOpt = None, top: TopOpt = 10, layers: LayersOpt = None,
        heads: HeadsOpt = None, from_layers: FromLayersOpt = None, to_layers: ToLayersOpt = None,
        from_heads: FromHeadsOpt = None, to_heads: ToHeadsOpt = None, block: BlockOpt = None,
        fold_ln: FoldOpt = True, fold_qk_norm: FoldQkNormOpt = False, precision: PrecisionOpt = Precision.float32,
        device: DeviceOpt = Device.cpu, revision: RevisionOpt = None, fmt: FormatOpt = None,
        output: OutputOpt = None, by: ByOpt = By.head,
    ) -> None:
        """How strongly each earlier head's output feeds each later head's queries (q), keys (k) and values (v):
        Elhage et al.'s composition scores from the weights, each beside the score of random heads (1/√d_model).

        Example: qkinspect composition ./my-llama --kinds k --top 20

        Example (one row per key/value head under grouped-query attention): qkinspect composition model.gguf
        --kinds k --by kv-head

        Example (every pair as rows): qkinspect composition model.gguf -o composition.parquet
        """
        from qkinspect.composition.request import CLI_NAMES
        from qkinspect.composition.run import composition as compose

        name = check_format(fmt, output)
        if top < 1:
            raise InputError(f"--top: {top} must be at least 1")
        with progress("composing heads") as p:
            result = compose(model, kinds=kinds, blocks=block, layers=layers, heads=heads, from_layers=from_layers,
                             to_layers=to_layers, from_heads=from_heads, to_heads=to_heads, fold_ln=fold_ln,
                             fold_qk_norm=fold_qk_norm, precision=precision.value, device=device.value,
                             revision=revision, progress=p, by=by.value, names=CLI_NAMES)
        for w in result.warnings:
            warn(w)
        for line in notes(result):
            note(line)
        write(result, top, name, output)


def check_format(fmt: RecordFormat | None, output: Path | None) -> str:
    """The format to write, refused before any work when it cannot be."""
    from qkinspect.cli.output import check_output, check_parquet, choose_format

    if check_parquet(fmt, output):
        return "parquet"
    check_output(fmt, output)
    return choose_format(fmt, output)


def write(result, top: int, name: str, output: Path | None) -> None:
    """The result in format `name`: Parquet from its columns, else through `emit` (the JSON document is made
    only for JSON: NDJSON and CSV write the rows as they are made)."""
    from qkinspect.cli.output import write_parquet

    if name == "parquet":
        write_parquet(result.columns(), output)
        return
    emit(composition_document(result, top, json=name == "json"), name, output)


def notes(result) -> list[str]:
    """What a reader must know about how the scores were made (stderr)."""
    p = result.processing
    out = [fold_line(p)]
    if p.rotary:
        out.append(f"{', '.join(p.rotary)}: rotary positions; W_Q W_Kᵀ is the zero-offset form")
    if p.qk_norm_not_folded:
        out.append(f"{', '.join(p.qk_norm_not_folded)}: q/k-norm gains not folded in (--fold-qk-norm folds them)")
    return out


def fold_line(p) -> str:
    if not p.fold_ln:
        return "weights as stored (--no-fold-ln)"
    line = "each layer's input-norm gain folded into W_Q, W_K, W_V (--no-fold-ln: as stored)"
    if p.not_folded:
        shown = ", ".join(p.not_folded[:3]) + (f" and {len(p.not_folded) - 3} more" if len(p.not_folded) > 3 else "")
        line += f"; no norm to fold for {shown}"
    return line


class _Rows:
    """The records as dicts, made afresh on each pass (CSV reads the rows twice: header, then rows)."""

    def __init__(self, result):
        self.result = result

    def __iter__(self):
        return self.result.rows()


def composition_document(result, top: int = 10, *, json: bool = True) -> Document:
    """JSON: the result's document (kind "composition"; `json=False` leaves it empty); rows: one per (earlier head,
    later head, kind), made as they are written; table: the `top` strongest pairs per kind."""
    from qkinspect.terminal.composition import render_composition

    return Document(json=result.document() if json else {}, rows=_Rows(result),  # type: ignore[arg-type]
                    render=lambda console: render_composition(console, result, top))


