"""One head's spectrum from an analysis that kept it (`analyze(..., spectra=...)`): its singular values, largest
first, and for the square forms its eigenvalues by decreasing modulus, as the JSON body and one tidy row per index
(`qkinspect spectrum` writes them; its table: `qkinspect.terminal.spectrum`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from qkinspect.analysis.results import AnalysisResult, HeadRecord
from qkinspect.documents import model_dict
from qkinspect.errors import InputError


def head_spectrum(result: AnalysisResult, matrix: str) -> tuple[HeadRecord, dict[str, Any], list[dict[str, Any]]]:
    """(the head, the document's body, the rows) for the one head of `result` and its `matrix` spectrum ("qk",
    "q", "k", "v", "ov"); InputError when that spectrum was not kept."""
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
    rows = [{"index": i, "singular_value": float(s)} for i, s in enumerate(sv)]
    if eig is None:
        return rows
    order = np.argsort(-np.abs(eig), kind="stable")
    for i, e in enumerate(eig[order]):
        if i == len(rows):
            rows.append({"index": i, "singular_value": None})
        rows[i].update(eig_real=float(e.real), eig_imag=float(e.imag), eig_abs=float(abs(e)))
    return rows
