"""`qkinspect directions`: each head's top singular directions of W_OV and W_QK, read as tokens."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from qkinspect.cli.engine_options import check_sweep_output, write_table
from qkinspect.cli.options import (
    BlockOpt,
    Device,
    DeviceOpt,
    FoldLnOpt,
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
from qkinspect.cli.output import Document, note, progress, warn
from qkinspect.errors import InputError
from qkinspect.files import check_writable

TopDirectionsOpt = Annotated[int, typer.Option(
    "--top-directions", "-k", metavar="K",
    help="Singular directions per matrix (a run of near-equal singular values reaching past K is kept whole).")]
class Reading(str, Enum):
    dot = "dot"
    cosine = "cosine"


ReadingOpt = Annotated[Reading, typer.Option(
    "--reading", help="How tokens score: dot (a token's dot product with the direction) or cosine (divided by the "
                      "token's row norm, so rare tokens with long embedding rows do not fill every list).")]
TopTokensOpt = Annotated[int, typer.Option("--top-tokens", "-n", metavar="N", help="Tokens per direction and sign.")]
PdfOpt = Annotated[Path | None, typer.Option(
    "--pdf", metavar="FILE", help="Also write the directions as a PDF report page (atomically).")]

FormatOpt = Annotated[RecordFormat | None, typer.Option(
    "--format", "-f", show_default=False, metavar="FORMAT",
    help="table, json, ndjson, csv or parquet (needs -o and pyarrow); default: from -o's extension, else table on "
         "a terminal and json in a pipe.")]


def register(app: typer.Typer) -> None:
    @app.command()
    def directions(
        model: ModelArg = None, layers: LayersOpt = None, heads: HeadsOpt = None, block: BlockOpt = None,
        top_directions: TopDirectionsOpt = 3, top_tokens: TopTokensOpt = 8, fold_ln: FoldLnOpt = False,
        fold_qk_norm: FoldQkNormOpt = False, precision: PrecisionOpt = Precision.float32,
        device: DeviceOpt = Device.cpu, revision: RevisionOpt = None, fmt: FormatOpt = None,
        output: OutputOpt = None, pdf: PdfOpt = None, reading: ReadingOpt = Reading.dot,
    ) -> None:
        """Each head's top singular directions of W_V W_O and W_Q W_Kᵀ, read as tokens: what a head reads and
        writes (OV: through the embedding and, with the final norm's gain, the unembedding) and what its queries
        and keys look for (QK: through the embedding), both signs; near-equal singular values as one subspace.
        See docs/directions.md for what such a reading means and what it does not.

        Cost (every head, -k 3, on a busy 2-core EPYC): the demo model (MiniLM, 72 heads, 30k tokens) 8 s and
        0.4 GiB; SmolLM2-135M (270 heads, 49k tokens) 23 s and 0.7 GiB. Time grows with heads x tokens x K.

        Example: qkinspect directions model.gguf --layers 0-2 --heads 0 --top-directions 2

        Example (late write sides without the hub tokens): qkinspect directions model.gguf --layers 25-29
        --reading cosine -k 3
        """
        from qkinspect.directions.run import directions as read_directions

        name = check_sweep_output(fmt, output)
        if pdf is not None:
            if pdf.suffix.lower() != ".pdf":
                raise InputError(f"--pdf {pdf}: name the file *.pdf")
            check_writable(pdf)
        from qkinspect.directions.request import CLI_NAMES

        with progress("reading directions") as p:
            result = read_directions(model, layers=layers, heads=heads, blocks=block, top_directions=top_directions,
                                     top_tokens=top_tokens, fold_ln=fold_ln, fold_qk_norm=fold_qk_norm,
                                     precision=precision.value, device=device.value, revision=revision, progress=p,
                                     reading=reading.value, names=CLI_NAMES)
        for w in result.warnings:
            warn(w)
        if not result.records and not result.warnings:
            raise InputError(f"{result.model.name}: the selection matched no heads of this model")
        write_table(directions_document(result), name, output)
        if pdf is not None:
            from qkinspect.files import write_rendered
            from qkinspect.report.directions.pdf import write_directions_pdf

            n = write_rendered(pdf, lambda buffer: write_directions_pdf(result, buffer))
            note(f"wrote a {n}-page PDF to {pdf}")


def directions_document(result) -> Document:
    """JSON: the library's document; rows: one per record; the table: one per head."""
    return Document(json=result.document(), rows=result.rows(), render=result.render_table)
