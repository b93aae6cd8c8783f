"""`qkinspect spectrum`: the singular values of one head's matrix, and the eigenvalues of W_Q W_Kᵀ or W_V W_O."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from qkinspect.analysis.results import envelope
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
from qkinspect.errors import InputError

if TYPE_CHECKING:
    import numpy as np


class Matrix(str, Enum):
    qk = "qk"
    q = "q"
    k = "k"
    v = "v"
    ov = "ov"


WITH_EIGENVALUES = {"qk", "ov"}  # square forms d_model x d_model; q, k, v are d_model x d_head
MATRIX_TEXT = {"qk": "W_Q W_Kᵀ", "q": "W_Q", "k": "W_K", "v": "W_V", "ov": "W_V W_O"}

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
    import numpy as np

    from qkinspect.analysis.results import model_dict

    (h,) = result.heads
    spectra = result.spectra.get((h.block, h.layer, h.head), {})
    if matrix not in spectra:
        raise InputError(f"no {matrix} spectrum was computed for {h.block} layer {h.layer} head {h.head}")
    sv = np.asarray(spectra[matrix], dtype=float)
    eig = np.asarray(spectra[f"{matrix}_eig"]) if f"{matrix}_eig" in spectra else None
    rows = _rows(sv, eig)
    pairs = None if eig is None else np.stack([eig.real, eig.imag], -1)  # (n,) complex -> (n, 2) [re, im]
    body = {"model": model_dict(result.model), "processing": result.processing, "block": h.block,
            "layer": h.layer, "head": h.head, "kv_head": h.kv_head, "matrix": matrix,
            "singular_values": sv, "eigenvalues": pairs}
    return Document(json=envelope("spectrum", **body), rows=rows,
                    render=lambda console: _render(console, result, h, matrix, rows))


def _rows(sv: np.ndarray, eig: np.ndarray | None) -> list[dict[str, Any]]:
    """Singular values largest first; eigenvalues by decreasing modulus, one per index."""
    rows = [{"index": i, "singular_value": float(s)} for i, s in enumerate(sv)]
    if eig is None:
        return rows
    import numpy as np

    order = np.argsort(-np.abs(eig), kind="stable")
    for i, e in enumerate(eig[order]):
        if i == len(rows):
            rows.append({"index": i, "singular_value": None})
        rows[i].update(eig_real=float(e.real), eig_imag=float(e.imag), eig_abs=float(abs(e)))
    return rows


def _render(console, result, h, matrix: str, rows: list[dict[str, Any]]) -> None:
    from qkinspect.terminal.tables import COLUMN_GAP, Column, fit_tables, fmt_value, model_line

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
