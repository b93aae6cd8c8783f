"""Per-head metrics of one layer: the table from metric name to function, and spectra.

Example:
    >>> from qkinspect.metrics.heads import measure_heads
    >>> values, spectra, warnings = measure_heads(layer, ["symmetry", "overlap_qk"])  # doctest: +SKIP
    >>> values["symmetry"].shape  # one value per query head  # doctest: +SKIP
    (12,)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch
from torch import Tensor

from qkinspect.errors import InputError
from qkinspect.layer import AttentionLayer
from qkinspect.metrics import norms, ov, similarity, symmetry
from qkinspect.metrics.factored import trace
from qkinspect.metrics.products import HeadProducts
from qkinspect.metrics.spectrum import (
    descending_eigvals,
    effective_rank,
    eig_positive_fraction,
    eig_real_ratio,
    energy_rank,
    participation_ratio,
    stable_rank,
)

Metric = Callable[[HeadProducts], Tensor]


def _eig_pos(p: HeadProducts) -> Tensor:
    return eig_positive_fraction(p.eig_qk) if p.square else p.nan()


def _eig_real(p: HeadProducts) -> Tensor:
    return eig_real_ratio(p.eig_qk, trace(p.c_qk)) if p.square else p.nan()


HEAD_METRICS: dict[str, Metric] = {
    "symmetry": symmetry.symmetry,
    "directionality": symmetry.directionality,
    "qk_effective_rank": lambda p: effective_rank(p.sigma_qk),
    "qk_stable_rank": lambda p: stable_rank(p.sigma_qk),
    "qk_participation_ratio": lambda p: participation_ratio(p.sigma_qk),
    "qk_k90": lambda p: energy_rank(p.sigma_qk, 0.9),
    "qk_eig_pos_frac": _eig_pos,
    "qk_eig_real_ratio": _eig_real,
    "shared_qk_distance": symmetry.shared_qk_distance,
    **{name: getattr(similarity, name) for name in
       ("overlap_qk", "overlap_qv", "overlap_kv", "cosine_qk", "cosine_qv", "cosine_kv", "cka_qk", "cka_qv",
        "cka_kv")},
    **{name: getattr(norms, name) for name in
       ("norm_q_fro", "norm_k_fro", "norm_v_fro", "norm_qk_fro", "norm_q_spec", "norm_k_spec", "norm_v_spec",
        "norm_qk_spec", "bias_q_norm", "bias_k_norm", "bias_v_norm")},
    "ov_effective_rank": ov.ov_effective_rank,
    "ov_copying": ov.ov_copying,
    "ov_norm_spec": ov.ov_norm_spec,
}
OV_METRICS = ("ov_effective_rank", "ov_copying", "ov_norm_spec")
OV_SPECTRA = ("ov", "ov_eig")


def needs_o(names: Iterable[str], spectra: Iterable[str] = ()) -> bool:
    """Whether any of these metrics or spectra reads W_O (the OV circuit).

    Example:
        >>> needs_o(["symmetry", "overlap_qk"], ["qk"]), needs_o(["ov_copying"])
        (False, True)
    """
    return any(n in OV_METRICS for n in names) or any(k in OV_SPECTRA for k in spectra)


def _spectrum(p: HeadProducts, key: str) -> Tensor | None:
    """One spectrum for every selected head, or None where it is not defined (no W_O; D != Dk for eigenvalues)."""
    if key in ("ov", "ov_eig") and p.O is None:
        return None
    if key == "qk_eig":
        return descending_eigvals(p.eig_qk) if p.square else None
    if key == "ov_eig":
        return descending_eigvals(p.eig_ov) if p.O.shape[-1] == p.V.shape[-2] else None
    return {"qk": lambda: p.sigma_qk, "q": lambda: p.fq.sigma, "k": lambda: p.fk.sigma, "v": lambda: p.fv.sigma,
            "ov": lambda: p.sigma_ov}[key]()


SPECTRA = ("qk", "qk_eig", "q", "k", "v", "ov", "ov_eig")


def check_spectra(keys: Iterable[str]) -> tuple[str, ...]:
    keys = tuple(keys)
    unknown = [k for k in keys if k not in SPECTRA]
    if unknown:
        raise InputError(f"unknown spectrum {', '.join(unknown)}; choose from {', '.join(SPECTRA)}")
    return keys


def measure_products(p: HeadProducts, names: Iterable[str], spectra: Iterable[str] = ()
                     ) -> tuple[dict[str, np.ndarray], dict[str, list[np.ndarray]]]:
    """Metric values (name -> (n,) float64) and spectra (key -> one array per head) of prepared products.

    Heads with non-finite weights get NaN everywhere (OV metrics also for a non-finite W_O). With "qk" spectra,
    the eigenvalues "qk_eig" come along when an eigenvalue metric computed them anyway; likewise "ov_eig".
    """
    values = {}
    for name in names:
        v = HEAD_METRICS[name](p)
        bad = p.bad_ov if name in OV_METRICS else p.bad
        values[name] = _numpy(torch.where(bad, torch.full_like(v, float("nan")), v))
    keys = list(dict.fromkeys(spectra))
    for have, extra, cached in (("qk", "qk_eig", "eig_qk"), ("ov", "ov_eig", "eig_ov")):
        if have in keys and extra not in keys and cached in vars(p):  # cached_property stores in the instance
            keys.append(extra)
    out_spectra = {}
    for key in keys:
        s = _spectrum(p, key)
        if s is not None:
            arr = s.detach().cpu().numpy()
            out_spectra[key] = [arr[i] for i in range(arr.shape[0])]
    return values, out_spectra


def _numpy(t: Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


def head_warnings(p: HeadProducts, where: str) -> list[str]:
    """One line per selected head whose weights are non-finite or zero (its ratios are NaN)."""
    out = []
    heads = p.heads.tolist()
    zero_q = (p.fq.fro2() == 0).tolist()
    zero_k = (p.fk.fro2() == 0).tolist()
    for i, h in enumerate(heads):
        if bool(p.bad[i]):
            out.append(f"{where} head {h}: non-finite weights (W_Q or its W_K/W_V); its metrics are NaN")
        elif zero_q[i] or zero_k[i]:
            what = "W_Q" if zero_q[i] else "W_K"
            out.append(f"{where} head {h}: {what} is zero; its ratios are NaN")
    return out


def measure_heads(layer: AttentionLayer, names: Iterable[str], *, heads: Iterable[int] | None = None,
                  spectra: Iterable[str] = (), dtype: torch.dtype = torch.float64, device: str = "cpu"):
    """Per-head metrics of one AttentionLayer (a convenience over HeadProducts + measure_products).

    Returns:
        (values, spectra, warnings): values name -> (n,) numpy array over the selected heads in order.
    """
    sel = None if heads is None else torch.as_tensor(list(heads), dtype=torch.int64)
    p = HeadProducts(layer, sel, dtype=dtype, device=device)
    values, spec = measure_products(p, names, spectra)
    return values, spec, head_warnings(p, f"{layer.block} layer {layer.layer}")
