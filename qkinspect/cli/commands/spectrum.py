"""`qkinspect spectrum`: the singular values of one head's matrix, and the eigenvalues of W_Q W_Kᵀ or W_V W_O."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from qkinspect.cli.options import (
    BlockOpt,
    Device,
    DeviceOpt,
    FoldLnOpt,
    FoldQkNormOpt,
    FormatOpt,
    ModelArg,
    OutputOpt,
    Precision,
    PrecisionOpt,
    RevisionOpt,
)
from qkinspect.cli.output import Document, check_output, emit
from qkinspect.documents import envelope


class Matrix(str, Enum):
    qk = "qk"
    q = "q"
    k = "k"
    v = "v"
    ov = "ov"


LayerOpt = Annotated[int, typer.Option("--layer", "-L", help="Layer index.")]
HeadOpt = Annotated[int, typer.Option("--head", "-H", help="Query head index (K/V read from its KV group).")]
MatrixOpt = Annotated[Matrix, typer.Option("--matrix", help="Which matrix of the head.")]


def register(app: typer.Typer) -> None:
    @app.command()
    def spectrum(
        model: ModelArg = None, layer: LayerOpt = 0, head: HeadOpt = 0, matrix: MatrixOpt = Matrix.qk,
        block: BlockOpt = None, fold_ln: FoldLnOpt = False, fold_qk_norm: FoldQkNormOpt = False,
        precision: PrecisionOpt = Precision.float32, device: DeviceOpt = Device.cpu, revision: RevisionOpt = None,
        fmt: FormatOpt = None, output: OutputOpt = None,
    ) -> None:
        """Singular values of one head's W_Q W_Kᵀ, W_Q, W_K, W_V or W_V W_O; eigenvalues too for qk and ov.

        Example: qkinspect spectrum ./my-bert --layer 3 --head 5 --matrix qk --format csv
        """
        from qkinspect.analysis.request import SPECTRUM_CLI_NAMES
        from qkinspect.analysis.spectrum import spectrum as one_head
        from qkinspect.cli.run import shown

        check_output(fmt, output)
        result = shown(lambda p: one_head(model, layer=layer, head=head, matrix=matrix.value, blocks=block,
                                          fold_ln=fold_ln, fold_qk_norm=fold_qk_norm, precision=precision,
                                          device=device, revision=revision, progress=p, names=SPECTRUM_CLI_NAMES))
        emit(spectrum_document(result, matrix.value), fmt, output)


def spectrum_document(result, matrix: str) -> Document:
    """The head's spectrum as a document: JSON arrays, one tidy row per index, a table."""
    from qkinspect.analysis.spectrum import head_spectrum
    from qkinspect.terminal.spectrum import render_spectrum

    h, body, rows = head_spectrum(result, matrix)
    return Document(json=envelope("spectrum", **body), rows=rows,
                    render=lambda console: render_spectrum(console, result, h, matrix, rows))
