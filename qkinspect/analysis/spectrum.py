"""One head's spectrum: `spectrum` analyses the one head of one block with the spectrum kept (the request checked
once, in the caller's names: `layer=`/`head=`, or spectrum's `--layer`/`--head`), and `head_spectrum` reads it
from an analysis that kept it (`analyze(..., spectra=...)`): its singular values, largest first, and for the square
forms its eigenvalues by decreasing modulus, as the JSON body and one tidy row per index (`qkinspect spectrum`
writes them; its table: `qkinspect.terminal.spectrum`)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from qkinspect.analysis.request import check_request, check_selection_of, measured_blocks
from qkinspect.analysis.results import AnalysisResult, HeadRecord
from qkinspect.documents import model_dict
from qkinspect.errors import InputError
from qkinspect.names import Names

if TYPE_CHECKING:
    import numpy as np

MATRICES = ("qk", "q", "k", "v", "ov")
WITH_EIGENVALUES = ("qk", "ov")  # square forms d_model x d_model; q, k, v are d_model x d_head
LIBRARY_NAMES = Names(layers="layer", heads="head")  # the one layer and head are `layer=` and `head=`


def spectrum(model=None, *, layer: int = 0, head: int = 0, matrix: str = "qk", blocks: Any = None,
             fold_ln: bool = False, fold_qk_norm: bool = False, precision: str = "float32", device: str = "cpu",
             revision: str | None = None, progress=None, names: Names = LIBRARY_NAMES) -> AnalysisResult:
    """The analysis of one head (query head `head` of layer `layer`) with its `matrix` spectrum kept ("qk", "q",
    "k", "v", "ov"; the eigenvalues too for qk and ov): `head_spectrum(result, matrix)` reads it. The head lives in
    one block: `blocks` names it (a kind or a label), or the model has only one. `names` as `analyze` takes them
    (the CLI's: `qkinspect.analysis.request.SPECTRUM_CLI_NAMES`).

    Raises:
        InputError: an unknown matrix, precision or device (before the model opens); a block, layer or head the
            model does not have, several blocks and none chosen, a q/k-norm fold where the block has none.

    Example:
        >>> h, body, rows = head_spectrum(spectrum(None, layer=2, head=3), "qk")  # doctest: +SKIP
    """
    matrix = str(getattr(matrix, "value", matrix))
    if matrix not in MATRICES:
        raise InputError(f"{names.said('matrix', matrix)}: choose one of {', '.join(MATRICES)}")
    spectra = (matrix, f"{matrix}_eig") if matrix in WITH_EIGENVALUES else (matrix,)
    request = check_request(["symmetry"], spectra, precision, device, fold_ln, fold_qk_norm, names=names,
                            layers=[layer], heads=[head], blocks=blocks)
    from qkinspect.loading import opened

    with opened(model, revision) as m:
        chosen = check_selection_of(request, m.info)
        keys = tuple(b.key for b in chosen)
        if len(keys) > 1:
            raise InputError(f"this model has several blocks ({', '.join(keys)}): choose one with {names.blocks}")
        one = dataclasses.replace(request, blocks=keys)
        specs = measured_blocks(one, chosen)
        from qkinspect.analysis.engine import measure  # torch: once the request and the model are checked

        return measure(m, one, specs, progress=progress)


def head_spectrum(result: AnalysisResult, matrix: str) -> tuple[HeadRecord, dict[str, Any], list[dict[str, Any]]]:
    """(the head, the document's body, the rows) for the one head of `result` and its `matrix` spectrum ("qk",
    "q", "k", "v", "ov"); InputError when that spectrum was not kept."""
    import numpy as np  # not at import: `spectrum` refuses a bad option without numpy or torch

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
    return h, body, rows


def _rows(sv: np.ndarray, eig: np.ndarray | None) -> list[dict[str, Any]]:
    """Singular values largest first; eigenvalues by decreasing modulus, one per index."""
    import numpy as np

    rows = [{"index": i, "singular_value": float(s)} for i, s in enumerate(sv)]
    if eig is None:
        return rows
    order = np.argsort(-np.abs(eig), kind="stable")
    for i, e in enumerate(eig[order]):
        if i == len(rows):
            rows.append({"index": i, "singular_value": None})
        rows[i].update(eig_real=float(e.real), eig_imag=float(e.imag), eig_abs=float(abs(e)))
    return rows
