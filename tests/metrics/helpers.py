"""Random layers for metric proofs, and the dense references: each metric written plainly on formed matrices
(numpy/scipy), the way a reader would check it by hand."""

from __future__ import annotations

import numpy as np
import scipy.linalg
import torch

from qkinspect.layer import AttentionLayer, BlockSpec


def factor(rng: np.random.Generator, rows: int, cols: int, rank: int | None = None) -> np.ndarray:
    """A (rows, cols) Gaussian matrix, of the given rank when `rank` < min(rows, cols) (0: a zero matrix)."""
    if rank is None or rank >= min(rows, cols):
        return rng.standard_normal((rows, cols))
    return rng.standard_normal((rows, rank)) @ rng.standard_normal((rank, cols))


def make_layer(seed: int, H: int = 4, G: int = 2, D: int = 12, d: int = 3, dv: int | None = None,
               Dk: int | None = None, q_ranks=None, k_ranks=None, with_o: bool = True, biases: bool = True,
               dtype=torch.float64) -> AttentionLayer:
    """A layer of Gaussian heads; q_ranks / k_ranks give per-head ranks (rank-deficient and zero heads)."""
    rng = np.random.default_rng(seed)
    dv, Dk = dv or d, Dk or D
    spec = BlockSpec(name="encoder" if Dk == D else "cross", n_layers=1, n_heads=H, n_kv_heads=G, d_model=D,
                     d_head=d, d_model_kv=None if Dk == D else Dk, d_head_v=None if dv == d else dv)
    q_ranks = q_ranks or [None] * H
    k_ranks = k_ranks or [None] * G
    t = lambda a: torch.tensor(np.asarray(a), dtype=dtype)  # noqa: E731
    return AttentionLayer(
        spec=spec, layer=0,
        W_Q=t([factor(rng, D, d, r) for r in q_ranks]),
        W_K=t([factor(rng, Dk, d, r) for r in k_ranks]),
        W_V=t([factor(rng, Dk, dv) for _ in range(G)]),
        W_O=t([factor(rng, dv, D) for _ in range(H)]) if with_o else None,
        b_Q=t(rng.standard_normal((H, d))) if biases else None,
        b_K=t(rng.standard_normal((G, d))) if biases else None,
        b_V=t(rng.standard_normal((G, dv))) if biases else None,
    )


def _ratio(a: float, b: float) -> float:
    return a / b if b != 0 else float("nan")


def _excess(x: np.ndarray) -> float:
    thr = x.mean() + 2 * x.std(ddof=1)
    return float(np.maximum(x - thr, 0).sum())


def _spectral_summaries(s: np.ndarray) -> dict[str, float]:
    if not s.any():
        return dict.fromkeys(["eff", "stable", "pr", "k90"], float("nan"))
    p = s / s.sum()
    p = p[p > 0]
    s2 = s**2
    k90 = int(np.argmax(np.cumsum(s2) >= 0.9 * s2.sum())) + 1
    return {"eff": float(np.exp(-(p * np.log(p)).sum())), "stable": s2.sum() / s2[0],
            "pr": s2.sum() ** 2 / (s2**2).sum(), "k90": float(k90)}


def _eig_stats(M: np.ndarray) -> tuple[float, float]:
    lam = np.linalg.eigvals(M)
    if not M.any():
        return float("nan"), float("nan")
    tol = 1e-3 * np.abs(lam).max()  # eigenvalues below 0.1% of the largest do not count
    nonzero = np.abs(lam) > tol
    return _ratio((lam.real > tol).sum(), nonzero.sum()), lam.real.sum() / np.abs(lam).sum()


def _shared_qk_distance(M: np.ndarray) -> float:
    """min over symmetric PSD P of ||M - P||_F / ||M||_F, by definition: P = the PSD part of (M + Mᵀ)/2."""
    lam, U = np.linalg.eigh((M + M.T) / 2)
    P = (U * lam.clip(min=0)) @ U.T
    return float(np.linalg.norm(M - P) / np.linalg.norm(M))


def _overlap(A: np.ndarray, B: np.ndarray) -> float:
    if not A.any() or not B.any():
        return float("nan")
    return float(np.mean(np.cos(scipy.linalg.subspace_angles(A, B)) ** 2))


def _cosine(A: np.ndarray, B: np.ndarray) -> float:
    return _ratio(float((A * B).sum()), float(np.linalg.norm(A) * np.linalg.norm(B)))


def _cka(A: np.ndarray, B: np.ndarray) -> float:
    Ac, Bc = A - A.mean(0), B - B.mean(0)
    return _ratio(np.linalg.norm(Ac.T @ Bc) ** 2, np.linalg.norm(Ac.T @ Ac) * np.linalg.norm(Bc.T @ Bc))


def dense_head(layer: AttentionLayer, h: int) -> dict[str, float]:
    """Every head metric of query head h, computed on the formed matrices."""
    g = h // (layer.spec.n_heads // layer.spec.n_kv_heads)
    A, B, V = (w.double().numpy() for w in (layer.W_Q[h], layer.W_K[g], layer.W_V[g]))
    M = A @ B.T
    square = A.shape[0] == B.shape[0]
    zero = not M.any()
    s = np.linalg.svd(M, compute_uv=False)[: A.shape[1]]
    spec = _spectral_summaries(s)
    out = {
        "symmetry": float("nan") if not square or zero else (M * M.T).sum() / (M * M).sum(),
        "qk_effective_rank": spec["eff"], "qk_stable_rank": spec["stable"],
        "qk_participation_ratio": spec["pr"], "qk_k90": spec["k90"],
        "overlap_kv": _overlap(B, V), "cka_kv": _cka(B, V),
        "cosine_kv": _cosine(B, V) if B.shape == V.shape else float("nan"),
        "norm_q_fro": np.linalg.norm(A), "norm_k_fro": np.linalg.norm(B), "norm_v_fro": np.linalg.norm(V),
        "norm_qk_fro": np.linalg.norm(M), "norm_q_spec": np.linalg.norm(A, 2), "norm_k_spec": np.linalg.norm(B, 2),
        "norm_v_spec": np.linalg.norm(V, 2), "norm_qk_spec": np.linalg.norm(M, 2),
    }
    R, C = _excess(np.linalg.norm(M, axis=1)), _excess(np.linalg.norm(M, axis=0))
    out["directionality"] = float("nan") if zero else ((R - C) / (R + C) if R + C > 0 else 0.0)
    nan2 = (float("nan"), float("nan"))
    out["qk_eig_pos_frac"], out["qk_eig_real_ratio"] = _eig_stats(M) if square else nan2
    out["shared_qk_distance"] = _shared_qk_distance(M) if square and not zero else float("nan")
    for name, X in (("qv", V), ("qk", B)):
        ok = square
        out[f"overlap_{name}"] = _overlap(A, X) if ok else float("nan")
        out[f"cka_{name}"] = _cka(A, X) if ok else float("nan")
        out[f"cosine_{name}"] = _cosine(A, X) if ok and A.shape == X.shape else float("nan")
    biases = (("q", layer.b_Q, h), ("k", layer.b_K, g), ("v", layer.b_V, g))
    for name, b, i in biases:
        out[f"bias_{name}_norm"] = float("nan") if b is None else float(np.linalg.norm(b[i].double().numpy()))
    out.update(dense_ov(layer, h, g, V))
    return out


def dense_ov(layer: AttentionLayer, h: int, g: int, V: np.ndarray) -> dict[str, float]:
    if layer.W_O is None:
        return dict.fromkeys(["ov_effective_rank", "ov_copying", "ov_norm_spec"], float("nan"))
    OV = V @ layer.W_O[h].double().numpy()  # (Dk, D)
    s = np.linalg.svd(OV, compute_uv=False)[: V.shape[1]]
    copying = float("nan")
    if OV.shape[0] == OV.shape[1]:
        lam = np.linalg.eigvals(OV)
        copying = lam.real.sum() / np.abs(lam).sum()
    return {"ov_effective_rank": _spectral_summaries(s)["eff"], "ov_copying": copying, "ov_norm_spec": s[0]}


def dense_layer_form(layer: AttentionLayer) -> dict[str, float]:
    H, G = layer.spec.n_heads, layer.spec.n_kv_heads
    M = sum(layer.W_Q[h].double().numpy() @ layer.W_K[h // (H // G)].double().numpy().T for h in range(H))
    if not M.any():
        return {"symmetry_layer": float("nan"), "directionality_layer": float("nan")}
    R, C = _excess(np.linalg.norm(M, axis=1)), _excess(np.linalg.norm(M, axis=0))
    sym = (M * M.T).sum() / (M * M).sum() if M.shape[0] == M.shape[1] else float("nan")
    return {"symmetry_layer": sym, "directionality_layer": (R - C) / (R + C) if R + C > 0 else 0.0}


def assert_close(got, want, rtol: float = 1e-5, atol: float = 1e-9, what: str = "") -> None:
    """Equal to rtol (relative to the larger magnitude), or both NaN."""
    got, want = float(got), float(want)
    if np.isnan(want) or np.isnan(got):
        assert np.isnan(want) and np.isnan(got), f"{what}: got {got}, dense reference {want}"
        return
    assert abs(got - want) <= atol + rtol * max(abs(got), abs(want)), f"{what}: got {got!r}, dense {want!r}"
