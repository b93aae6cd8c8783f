"""How a weight metric and a behaviour score relate across heads: Spearman's rank correlation, with a percentile
bootstrap interval over heads and a permutation p-value (numpy and scipy's ranks; docs/heads.md, "Relations").

Within layers, the heads of each layer are ranked among themselves and the ranks centred per layer before they
are pooled (the correlation of within-layer ranks): depth, which moves both sides of many pairs, then cannot make
a relation. Over one group this is Spearman's ρ itself (tested against scipy.stats.spearmanr). The bootstrap
resamples heads within each group; the permutations shuffle the score within each group.

Example:
    >>> r = relate([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [2, 1, 4, 3, 6, 5, 8, 7, 10, 9], resamples=200)
    >>> round(r.rho, 3), r.n
    (0.939, 10)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BOOTSTRAP = 1000  # resamples for the interval
PERMUTATIONS = 1000  # shuffles for the p-value
LEVEL = 0.95


@dataclass(frozen=True)
class Relation:
    """ρ over `n` heads, its 95 % percentile-bootstrap interval (None where it is undefined or too few heads to
    resample) and the permutation p-value (None where ρ is undefined)."""

    rho: float | None
    low: float | None
    high: float | None
    p: float | None
    n: int


def _ranks(x: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(x, axis=-1)  # average ranks for ties, along the last axis


def _pooled(x: np.ndarray, y: np.ndarray, groups: list[np.ndarray]) -> np.ndarray:
    """The correlation of within-group centred ranks; x, y (..., n); NaN where a side is constant."""
    rx = np.empty_like(x, dtype=np.float64)
    ry = np.empty_like(y, dtype=np.float64)
    for g in groups:
        for src, dst in ((x, rx), (y, ry)):
            r = _ranks(src[..., g])
            dst[..., g] = r - r.mean(-1, keepdims=True)
    sxy = (rx * ry).sum(-1)
    sxx, syy = (rx * rx).sum(-1), (ry * ry).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((sxx > 0) & (syy > 0), sxy / np.sqrt(sxx * syy), np.nan)


def relate(x: Sequence[float], y: Sequence[float], groups: Sequence[object] | None = None, *,
           resamples: int = BOOTSTRAP, permutations: int = PERMUTATIONS, seed: int = 0) -> Relation:
    """Spearman's ρ of x and y over the heads where both are numbers (within `groups` when given: one label per
    head), its bootstrap interval and permutation p-value, from a fixed `seed`."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    labels = np.zeros(len(x), dtype=np.int64) if groups is None else np.unique(
        np.asarray(groups, dtype=object).astype(str), return_inverse=True)[1]
    keep = np.isfinite(x) & np.isfinite(y)
    x, y, labels = x[keep], y[keep], labels[keep]
    idx = [np.flatnonzero(labels == g) for g in np.unique(labels)]
    idx = [g for g in idx if len(g) >= 2]  # a group of one has no within-group rank
    n = int(sum(len(g) for g in idx))
    rho = float(_pooled(x, y, idx)) if n >= 3 else float("nan")
    if not np.isfinite(rho):
        return Relation(None, None, None, None, n)
    rng = np.random.default_rng(seed)
    low = high = None
    if resamples > 0 and n >= 4:
        pick = np.concatenate([g[rng.integers(0, len(g), size=(resamples, len(g)))] for g in idx], axis=1)
        boot = _pooled(x[pick], y[pick], _positions(idx))
        # a resample that repeats one head can leave a side constant (NaN): the interval is over the others, and
        # none where more than a tenth are undefined
        if np.isfinite(boot).mean() >= 0.9:
            a = (1 - LEVEL) / 2
            low, high = (float(v) for v in np.nanquantile(boot, [a, 1 - a]))
    p = None
    if permutations > 0:
        shuffled = np.broadcast_to(y, (permutations, len(y))).copy()
        for g in idx:
            shuffled[:, g] = rng.permuted(shuffled[:, g], axis=1)
        null = _pooled(np.broadcast_to(x, shuffled.shape), shuffled, idx)
        hits = int(np.sum(np.abs(null) >= abs(rho) - 1e-12))
        p = (1 + hits) / (1 + permutations)
    return Relation(rho, low, high, p, n)


def _positions(idx: list[np.ndarray]) -> list[np.ndarray]:
    """The groups' columns in the concatenated resample (group 0 first)."""
    out, start = [], 0
    for g in idx:
        out.append(np.arange(start, start + len(g)))
        start += len(g)
    return out
