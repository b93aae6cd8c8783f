"""Per-head metrics of one layer: the table from metric name to function, and spectra.

Example:
    >>> from qkinspect.metrics.heads import measure_heads
    >>> values, spectra, warnings = measure_heads(layer, ["symmetry", "overlap_qk"])  # doctest: +SKIP
    >>> values["symmetry"].shape  # one value per query head  # doctest: +SKIP
    (12,)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from qkinspect.layer import AttentionLayer
from qkinspect.metrics import norms, ov, similarity, symmetry
from qkinspect.metrics.factored import RANK_RTOL, GramFactor, per_thread, trace
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
    if key in ("ov", "ov_eig") and not p.has_o:
        return None
    if key == "qk_eig":
        return descending_eigvals(p.eig_qk) if p.square else None
    if key == "ov_eig":
        return descending_eigvals(p.eig_ov) if p.shape("O")[-1] == p.shape("V")[-2] else None
    return {"qk": lambda: p.sigma_qk, "q": lambda: p.fq.sigma, "k": lambda: p.fk.sigma, "v": lambda: p.fv.sigma,
            "ov": lambda: p.sigma_ov}[key]()


@dataclass(frozen=True)
class Numerics:
    """How the heads of one layer were computed: the numerical rank kept (σ > RANK_RTOL · σ_max) of W_Q, W_K,
    W_V per head ("rank_q", "rank_k", "rank_v" -> (n,) int64), and the heads recomputed in float64 (n,) bool."""

    ranks: dict[str, np.ndarray]
    recomputed: np.ndarray
    widths: dict[str, int]

    @property
    def cut(self) -> np.ndarray:
        """(n,) heads with some direction of W_Q, W_K or W_V dropped by the rank cut (zero factors excluded)."""
        out = np.zeros(self.recomputed.shape, dtype=bool)
        for name, r in self.ranks.items():
            out |= (r > 0) & (r < self.widths[name])
        return out


def measure_products(p: HeadProducts, names: Iterable[str], spectra: Iterable[str] = ()
                     ) -> tuple[dict[str, np.ndarray], dict[str, list[np.ndarray]], Numerics]:
    """Metric values (name -> (n,) float64), spectra (key -> one array per head) and Numerics of prepared products.

    Heads whose factors the products' precision cannot resolve (`HeadProducts.unresolved`: float32 Grams of
    ill-conditioned factors) are measured again in float64 and their values, spectra and ranks replaced, so every
    head gets its metric's value in either precision. Heads with non-finite weights get NaN everywhere (OV metrics
    also for a non-finite W_O). With "qk" spectra, the eigenvalues "qk_eig" come along when an eigenvalue metric
    computed them anyway; likewise "ov_eig".
    """
    names = list(names)
    _decompose_meanwhile(p, names)
    redo = p.unresolved  # W_Q, W_K, W_V: from the eigenvalues of Grams every run decomposes
    if p.n and bool(redo.all()):  # nothing for the fast route (a model as ill-conditioned as Gemma-3): skip it
        exact = p.exact(redo)
        values, out_spectra = _measure(exact, names, spectra)
        ranks = {k: _numpy(v, torch.int64) for k, v in exact.ranks.items()}
        return values, out_spectra, Numerics(ranks, _numpy(redo, torch.bool), _widths(p))
    values, out_spectra = _measure(p, names, spectra)
    ranks = {k: _numpy(v, torch.int64) for k, v in p.ranks.items()}
    redo = p.unresolved  # again: W_O and [W_Q W_K] too, where the metrics decomposed them
    if bool(redo.any()):
        exact = p.exact(redo)
        idx = redo.nonzero().squeeze(-1).tolist()
        v64, s64 = _measure(exact, names, spectra)
        for name, v in v64.items():
            values[name][idx] = v
        for key, per_head in s64.items():
            for j, i in enumerate(idx):
                out_spectra[key][i] = per_head[j].astype(out_spectra[key][i].dtype)
        for name, r in exact.ranks.items():
            ranks[name][idx] = _numpy(r, torch.int64)
    return values, out_spectra, Numerics(ranks, _numpy(redo, torch.bool), _widths(p))


_CROSS = {  # cross product -> the metrics that read it
    "c_qk": {"symmetry", "overlap_qk", "cosine_qk", "cka_qk", "qk_eig_pos_frac", "qk_eig_real_ratio",
             "shared_qk_distance"},
    "c_qv": {"overlap_qv", "cosine_qv", "cka_qv"},
    "c_kv": {"overlap_kv", "cosine_kv", "cka_kv"},
}
_WHITENED = {"fq": {"overlap_qk", "overlap_qv"}, "fk_all": {"overlap_qk", "overlap_kv"},
             "fv_all": {"overlap_qv", "overlap_kv"}}  # factor -> the metrics that read its whitener
def _background() -> ThreadPoolExecutor:
    """The calling thread's own decomposition thread (layers measured side by side do not queue for one)."""
    return per_thread("decompose", lambda: ThreadPoolExecutor(1, thread_name_prefix="qkinspect-decompose"))


def _decompose_meanwhile(p: HeadProducts, names: list[str]) -> None:
    """Form the Grams and the cross products the metrics read (GEMMs, on torch's threads) while one background
    thread decomposes each Gram as soon as it exists (eigenvalues, Cholesky factor, and the whitener where an
    overlap reads it: LAPACK, one thread per chunk of heads, `factored.threaded`), so the two overlap instead of
    following each other. Every run needs the eigenvalues of the three Grams (`unresolved`, ranks), so nothing
    is computed that the metrics would not ask for; the values are those of the sequential order (same routines
    on the same inputs). CPU runs with two or more torch threads only."""
    threads = torch.get_num_threads()
    if p.device.type != "cpu" or p.n == 0 or threads < 2:
        return
    wanted = set(names)
    background = _background()
    jobs = []
    for name in ("fq", "fv_all") if p.same_qk else ("fq", "fk_all", "fv_all"):
        f = getattr(p, name)  # its Gram: a GEMM here
        jobs.append(background.submit(_decompose, f, bool(_WHITENED[name] & wanted), threads))
    for name, readers in _CROSS.items():
        if readers & wanted and (p.square or name == "c_kv"):
            getattr(p, name)  # a GEMM here, while the Grams are decomposed
    for job in jobs:
        job.result()


def _decompose(f: GramFactor, whiten: bool, threads: int) -> None:
    if torch.get_num_threads() != threads:  # this thread's count as the caller's: `threaded` splits by it
        torch.set_num_threads(threads)
    f.evals  # noqa: B018 (a cached property: computed here)
    if whiten:
        f.whitener  # noqa: B018


def _widths(p: HeadProducts) -> dict[str, int]:
    return {"rank_q": p.shape("Q")[-1], "rank_k": p.shape("K")[-1], "rank_v": p.shape("V")[-1]}


def _measure(p: HeadProducts, names: list[str], spectra: Iterable[str]
             ) -> tuple[dict[str, np.ndarray], dict[str, list[np.ndarray]]]:
    values = {}
    for name in names:
        v = HEAD_METRICS[name](p)
        bad = p.bad_ov if name in OV_METRICS else p.bad
        values[name] = _numpy(torch.where(bad, torch.full_like(v, float("nan")), v))
    keys = list(dict.fromkeys(spectra))
    for have, extra, cached in (("qk", "qk_eig", "eig_qk"), ("ov", "ov_eig", "eig_ov")):
        if have in keys and extra not in keys and cached in vars(p):  # a cached attribute is stored in the instance
            keys.append(extra)
    out_spectra = {}
    for key in keys:
        s = _spectrum(p, key)
        if s is not None:
            arr = s.detach().cpu().numpy()
            out_spectra[key] = [arr[i] for i in range(arr.shape[0])]
    return values, out_spectra


def _numpy(t: Tensor, dtype: torch.dtype = torch.float64) -> np.ndarray:
    return t.detach().to("cpu", dtype).numpy()


def numerics_warning(recomputed: int, cut: int, n: int, precision: str) -> str | None:
    """The one line a result carries when heads were recomputed in float64 or directions cut (None otherwise).

    Example:
        >>> numerics_warning(3, 1, 144, "float32")
        '3 of 144 heads recomputed in float64 (float32 Grams cannot resolve their smallest directions); 1 head has \
directions of W_Q, W_K or W_V below the rank cut σ <= 1e-05 σ_max, dropped (rank_q, rank_k, rank_v say how many \
were kept)'
    """
    parts = [recompute_note(recomputed, n, precision)] if recomputed else []
    if cut:
        parts.append(f"{cut} head{' has' if cut == 1 else 's have'} directions of W_Q, W_K or W_V below the rank cut "
                     f"σ <= {RANK_RTOL:g} σ_max, dropped (rank_q, rank_k, rank_v say how many were kept)")
    return "; ".join(parts) or None


def recompute_note(recomputed: int, n: int, precision: str) -> str:
    """'3 of 144 heads recomputed in float64 (float32 Grams cannot resolve their smallest directions)'."""
    return (f"{recomputed} of {n} heads recomputed in float64 ({precision} Grams cannot resolve their smallest "
            "directions)")


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
        (values, spectra, warnings): values name -> (n,) numpy array over the selected heads in order, with the
        ranks kept ("rank_q", "rank_k", "rank_v") beside the metrics.
    """
    sel = None if heads is None else torch.as_tensor(list(heads), dtype=torch.int64)
    p = HeadProducts(layer, sel, dtype=dtype, device=device)
    values, spec, num = measure_products(p, names, spectra)
    values.update(num.ranks)
    warnings = head_warnings(p, f"{layer.block} layer {layer.layer}")
    line = numerics_warning(int(num.recomputed.sum()), int(num.cut.sum()), p.n, str(dtype).removeprefix("torch."))
    return values, spec, warnings + ([line] if line else [])
