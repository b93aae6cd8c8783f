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
    Selection,
    check_selection,
    parse_blocks,
)
from qkinspect.cli.output import Document, check_output, emit
from qkinspect.documents import envelope
from qkinspect.errors import InputError


class Matrix(str, Enum):
    qk = "qk"
    q = "q"
    k = "k"
    v = "v"
    ov = "ov"


WITH_EIGENVALUES = {"qk", "ov"}  # square forms d_model x d_model; q, k, v are d_model x d_head

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
        from qkinspect.cli.run import run_analysis
        from qkinspect.loading import open_model

        check_output(fmt, output)
        with open_model(model, revision=revision) as m:
            check_selection(m.info, parse_blocks(block), (layer,), (head,), options=("--layer", "--head"))
            sel = Selection.parse(layers=str(layer), heads=str(head), blocks=[_one_block(m.info, block)],
                                  metrics=["symmetry"], precision=precision, device=device, fold_ln=fold_ln,
                                  fold_qk_norm=fold_qk_norm)
            spectra = (matrix.value, f"{matrix.value}_eig") if matrix.value in WITH_EIGENVALUES else (matrix.value,)
            result = run_analysis(m, sel, spectra=spectra)
        emit(spectrum_document(result, matrix.value), fmt, output)


def _one_block(info, block: list[str] | None) -> str:
    """The one block the head lives in: --block names it (a kind or a label), or the model has only one."""
    keys = check_selection(info, parse_blocks(block), None) or tuple(b.key for b in info.blocks)
    if len(keys) > 1:
        raise InputError(f"this model has several blocks ({', '.join(keys)}): choose one with --block")
    return keys[0]


def spectrum_document(result, matrix: str) -> Document:
    """The head's spectrum as a document: JSON arrays, one tidy row per index, a table."""
    from qkinspect.analysis.spectrum import head_spectrum
    from qkinspect.terminal.spectrum import render_spectrum

    h, body, rows = head_spectrum(result, matrix)
    return Document(json=envelope("spectrum", **body), rows=rows,
                    render=lambda console: render_spectrum(console, result, h, matrix, rows))
