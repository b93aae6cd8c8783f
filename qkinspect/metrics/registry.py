"""Every metric's definition in one place: name, group, range, gauge invariance, cost, default; and the
resolution of user-given names and groups into the metrics to compute (docs/metrics.md says the same in prose).

Gauge invariance is with respect to the re-basings that leave the model's function unchanged: W_Q -> W_Q G,
W_K -> W_K G⁻ᵀ (any invertible G per head; every attention score is unchanged) and W_V -> W_V G', W_O -> G'⁻¹ W_O.
"yes": invariant under all of them; "orthogonal": only under orthogonal G, G'; "no": changes even then.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from qkinspect.errors import InputError
from qkinspect.suggest import did_you_mean

Gauge = Literal["yes", "no", "orthogonal"]
SAPONATI = "Saponati et al. 2025, arXiv:2502.10927"
ROY = "Roy & Vetterli 2007, The effective rank"
KORNBLITH = "Kornblith et al. 2019, Similarity of neural network representations revisited"
KITAEV = "Kitaev et al. 2020, Reformer: the efficient transformer (shared-QK attention)"
ELHAGE = "Elhage et al. 2021, A mathematical framework for transformer circuits"
D3 = "O(D d²) per head"
EIG = "O(D d²) + O(d³) eigenvalues per head"


@dataclass(frozen=True)
class MetricSpec:
    """One metric: what it is, where it is defined, what it costs, and whether it describes the model or only
    its parameterisation."""

    name: str
    group: str
    description: str
    range: str
    gauge_invariant: Gauge
    per: Literal["head", "layer"] = "head"
    default: bool = True
    cost: str = D3
    reference: str = ""
    requires: str = ""  # when it is NaN: e.g. "W_O", "D == Dk"
    source: str = ""  # a layer summary: the head metric it summarises

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _m(name, group, description, range_, gauge, **kw) -> MetricSpec:
    return MetricSpec(name, group, description, range_, gauge, **kw)


SQUARE = "D == Dk (queries and keys read the same space)"
_HEAD = [
    _m("symmetry", "form", "⟨M, Mᵀ⟩_F / ||M||_F² of M = W_Q W_Kᵀ: 1 symmetric, -1 skew, ~0 random", "[-1, 1]", "yes",
       reference=SAPONATI, requires=SQUARE),
    _m("directionality", "form", "(R - C)/(R + C) from the outlier excess of M's row (R) and column (C) norms; "
       "negative: a few key directions dominate", "[-1, 1]", "yes", reference=SAPONATI),
    _m("qk_effective_rank", "rank", "exp(entropy of σ_i/Σσ) of M's singular values", "[1, d_head]", "yes",
       reference=ROY),
    _m("qk_stable_rank", "rank", "||M||_F² / σ_1²", "[1, d_head]", "yes"),
    _m("qk_participation_ratio", "rank", "(Σσ²)² / Σσ⁴ of M's singular values", "[1, d_head]", "yes"),
    _m("qk_k90", "rank", "smallest k whose top singular values hold 90% of Σσ²", "[1, d_head]", "yes"),
    _m("qk_eig_pos_frac", "eigen", "fraction of M's eigenvalues (|λ| > 1e-3 max|λ|) with Re λ > 1e-3 max|λ|",
       "[0, 1]", "yes", default=False, cost=EIG, requires=SQUARE),
    _m("qk_eig_real_ratio", "eigen", "Re Σλ / Σ|λ| over M's eigenvalues (tr M / Σ|λ|)", "[-1, 1]", "yes",
       default=False, cost=EIG, requires=SQUARE),
    _m("shared_qk_distance", "eigen", "relative distance from M to the nearest form one shared matrix gives (W Wᵀ: "
       "symmetric positive semi-definite), sqrt((||M_skew||² + Σ_{λ<0} λ²)/||M||²) over the eigenvalues λ of M's "
       "symmetric part; 0: queries and keys could share W", "[0, 1]", "yes", default=False,
       cost="O(D d²) + O(d³) eigenvalues (2d x 2d) per head", reference=KITAEV, requires=SQUARE),
    _m("overlap_qk", "overlap", "mean cos² of the principal angles between the column spaces of W_Q and W_K",
       "[0, 1]", "yes", requires=SQUARE),
    _m("overlap_qv", "overlap", "mean cos² of the principal angles between the column spaces of W_Q and W_V",
       "[0, 1]", "yes", requires=SQUARE),
    _m("overlap_kv", "overlap", "mean cos² of the principal angles between the column spaces of W_K and W_V",
       "[0, 1]", "yes"),
    _m("cosine_qk", "cosine", "entry-wise cosine ⟨W_Q, W_K⟩_F / (||W_Q|| ||W_K||): basis-dependent", "[-1, 1]",
       "orthogonal", requires=SQUARE),
    _m("cosine_qv", "cosine", "entry-wise cosine of W_Q and W_V: basis-dependent", "[-1, 1]", "no",
       requires=SQUARE + " and d_head == d_head_v"),
    _m("cosine_kv", "cosine", "entry-wise cosine of W_K and W_V: basis-dependent", "[-1, 1]", "no",
       requires="d_head == d_head_v"),
    _m("cka_qk", "cka", "linear CKA of W_Q and W_K (rows as samples, centred)", "[0, 1]", "orthogonal",
       reference=KORNBLITH, requires=SQUARE),
    _m("cka_qv", "cka", "linear CKA of W_Q and W_V (rows as samples, centred)", "[0, 1]", "orthogonal",
       reference=KORNBLITH, requires=SQUARE),
    _m("cka_kv", "cka", "linear CKA of W_K and W_V (rows as samples, centred)", "[0, 1]", "orthogonal",
       reference=KORNBLITH),
    _m("norm_q_fro", "norms", "Frobenius norm of W_Q", "[0, inf)", "orthogonal"),
    _m("norm_k_fro", "norms", "Frobenius norm of W_K", "[0, inf)", "orthogonal"),
    _m("norm_v_fro", "norms", "Frobenius norm of W_V", "[0, inf)", "orthogonal"),
    _m("norm_qk_fro", "norms", "Frobenius norm of M = W_Q W_Kᵀ", "[0, inf)", "yes"),
    _m("norm_q_spec", "norms", "spectral norm of W_Q", "[0, inf)", "orthogonal"),
    _m("norm_k_spec", "norms", "spectral norm of W_K", "[0, inf)", "orthogonal"),
    _m("norm_v_spec", "norms", "spectral norm of W_V", "[0, inf)", "orthogonal"),
    _m("norm_qk_spec", "norms", "spectral norm of M = W_Q W_Kᵀ", "[0, inf)", "yes"),
    _m("bias_q_norm", "bias", "norm of the query bias", "[0, inf)", "orthogonal", cost="O(d) per head",
       requires="a query bias"),
    _m("bias_k_norm", "bias", "norm of the key bias", "[0, inf)", "orthogonal", cost="O(d) per head",
       requires="a key bias"),
    _m("bias_v_norm", "bias", "norm of the value bias", "[0, inf)", "orthogonal", cost="O(d) per head",
       requires="a value bias"),
    _m("ov_effective_rank", "ov", "effective rank of W_OV = W_V W_O", "[1, d_head_v]", "yes", default=False,
       reference=ROY, requires="W_O"),
    _m("ov_copying", "ov", "Re Σλ / Σ|λ| of W_OV's eigenvalues (copying score on the residual stream)", "[-1, 1]",
       "yes", default=False, reference=ELHAGE, cost=EIG, requires="W_O and D == Dk"),
    _m("ov_norm_spec", "ov", "spectral norm of W_OV = W_V W_O", "[0, inf)", "yes", default=False, requires="W_O"),
]

SUMMARY = "O(H) per layer"
_LAYER = [
    _m("symmetry_median", "summary", "median symmetry over the layer's heads", "[-1, 1]", "yes", per="layer",
       cost=SUMMARY, source="symmetry"),
    _m("symmetry_mean", "summary", "mean symmetry over the layer's heads", "[-1, 1]", "yes", per="layer",
       cost=SUMMARY, source="symmetry"),
    _m("overlap_qk_median", "summary", "median overlap_qk over the layer's heads", "[0, 1]", "yes", per="layer",
       cost=SUMMARY, source="overlap_qk"),
    _m("qk_effective_rank_median", "summary", "median qk_effective_rank over the layer's heads", "[1, d_head]",
       "yes", per="layer", cost=SUMMARY, source="qk_effective_rank"),
    _m("symmetry_layer", "layer_form", "symmetry of the layer's summed form Σ_h W_Q^h W_K^g(h)ᵀ (all heads)",
       "[-1, 1]", "yes", per="layer", default=False, cost="O(D³) per layer", reference=SAPONATI, requires=SQUARE),
    _m("directionality_layer", "layer_form", "directionality of the layer's summed form (all heads)", "[-1, 1]",
       "yes", per="layer", default=False, cost="O(D³) per layer", reference=SAPONATI),
    _m("head_overlap", "head_similarity", "(H, H) matrix: overlap of the query-side column spaces of heads i and j",
       "[0, 1]", "yes", per="layer", default=False, cost="O(H² D d²) per layer"),
]

METRICS: dict[str, MetricSpec] = {m.name: m for m in _HEAD + _LAYER}
HEAD_METRIC_NAMES = tuple(m.name for m in _HEAD)
LAYER_METRIC_NAMES = tuple(m.name for m in _LAYER)
LAYER_FORM = ("symmetry_layer", "directionality_layer")
INTEGER_METRICS = ("qk_k90",)  # counts (stored as floats): tables print a whole value without decimals
# Groups that are unions of the metrics' own groups, plus the two selections by default-ness.
_UNIONS = {"spectrum": ("rank", "eigen"), "similarity": ("overlap", "cosine", "cka")}


def groups() -> dict[str, tuple[str, ...]]:
    """Group name -> metric names, in registry order ("default" and "all" included)."""
    out: dict[str, list[str]] = {}
    for m in METRICS.values():
        out.setdefault(m.group, []).append(m.name)
    for union, parts in _UNIONS.items():
        out[union] = [n for p in parts for n in out[p]]
    out["default"] = [m.name for m in METRICS.values() if m.default]
    out["all"] = list(METRICS)
    return {k: tuple(v) for k, v in out.items()}


def resolve_metrics(names: Iterable[str] | str | None = None, *, layer_form: bool = False) -> tuple[str, ...]:
    """The metric names to compute, in registry order, from metric and group names (None: the defaults).

    A layer summary brings in the head metric it summarises, and each computed head metric brings its
    summaries; `layer_form` adds symmetry_layer and directionality_layer.

    Raises:
        InputError: an unknown name, listing the known metrics and groups.

    Example:
        >>> resolve_metrics(["symmetry", "overlap"])[:4]
        ('symmetry', 'overlap_qk', 'overlap_qv', 'overlap_kv')
    """
    if isinstance(names, str):
        names = [n for n in names.split(",")]
    gs = groups()
    wanted: set[str] = set()
    for raw in names if names is not None else ["default"]:
        n = raw.strip()
        if n in METRICS:
            wanted.add(n)
        elif n in gs:
            wanted.update(gs[n])
        else:
            hint = did_you_mean(n, [*METRICS, *gs])
            raise InputError(f"unknown metric {n!r}{hint}; metrics: {', '.join(METRICS)}; groups: {', '.join(gs)}")
    if layer_form:
        wanted.update(LAYER_FORM)
    for m in METRICS.values():
        if m.source and m.name in wanted:
            wanted.add(m.source)
    for m in METRICS.values():
        if m.source and m.source in wanted:
            wanted.add(m.name)
    return tuple(n for n in METRICS if n in wanted)


def head_metric(name: str, option: str = "--metric") -> MetricSpec:
    """The spec of per-head metric `name`.

    Raises:
        InputError: `name` is not a per-head metric (a layer summary, a group, a typo), listing those that are.

    Example:
        >>> head_metric("shared_qk_distance").range
        '[0, 1]'
    """
    spec = METRICS.get(name)
    if spec is None or spec.per != "head":
        hint = did_you_mean(name, HEAD_METRIC_NAMES)
        raise InputError(f"{option} {name!r} is not a per-head metric{hint}; choose one of: "
                         f"{', '.join(HEAD_METRIC_NAMES)}")
    return spec


def definitions(names: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """JSON-ready definitions, name -> {group, description, range, gauge_invariant, per, default, cost, reference,
    requires, source}, for `names` (all metrics when None); names not in the registry are skipped.

    Example:
        >>> definitions(["symmetry"])["symmetry"]["gauge_invariant"]
        'yes'
    """
    chosen = METRICS if names is None else [n for n in names if n in METRICS]
    return {n: {k: v for k, v in METRICS[n].as_dict().items() if k != "name"} for n in chosen}


SPECTRA = ("qk", "qk_eig", "q", "k", "v", "ov", "ov_eig")  # the spectra an analysis may keep per head


def check_spectra(keys: Iterable[str]) -> tuple[str, ...]:
    """The spectra asked for, or InputError naming the unknown ones (torch-free: a request is checked first)."""
    keys = tuple(keys)
    unknown = [k for k in keys if k not in SPECTRA]
    if unknown:
        raise InputError(f"unknown spectrum {', '.join(unknown)}; choose from {', '.join(SPECTRA)}")
    return keys
