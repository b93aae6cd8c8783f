"""Head edits: pure functions from an `AttentionLayer` to an edited copy (docs/experiments.md, "Edits")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import torch
from torch import Tensor

from qkinspect.experiment.edits import forms
from qkinspect.experiment.edits import qknorm as qkn
from qkinspect.experiment.edits.names import Edit, EditError
from qkinspect.experiment.edits.rotary import RotaryLayout, rotary_layout
from qkinspect.layer import AttentionLayer, BlockSpec
from qkinspect.metrics.factored import one_thread


@dataclass(frozen=True)
class EditResult:
    """An edited copy of a layer (same canonical layout), and what predicts each edited head's cost."""

    layer: AttentionLayer
    offset0_only: bool
    predicted: dict[int, float]
    details: dict[int, dict[str, float]] = field(default_factory=dict)


def expand_kv(layer: AttentionLayer) -> AttentionLayer:
    """The same layer with one key/value head per query head (head h gets a copy of KV head h // group)."""
    s = layer.spec
    if s.n_kv_heads == s.n_heads:
        return layer
    kv = layer.kv_index()
    k_norm = layer.k_norm
    if k_norm is not None and k_norm.dim() == 2:
        k_norm = k_norm[kv]
    take = lambda t: None if t is None else t[kv].clone()  # noqa: E731
    return replace(layer, spec=replace(s, n_kv_heads=s.n_heads), W_K=take(layer.W_K), W_V=take(layer.W_V),
                   b_K=take(layer.b_K), b_V=take(layer.b_V), k_norm=k_norm, extra=dict(layer.extra))


# What EditResult.predicted holds for each edit: a relative Frobenius change (for rotary heads, of the scores'
# bilinear form averaged over offsets; docs/experiments.md). For share_qk it is `shared_qk_distance`.
PREDICTORS = {
    "share_qk": "shared_qk_distance",
    "tie_q": "relative change of W_Q W_Kᵀ",
    "tie_k": "relative change of W_Q W_Kᵀ",
    "symmetric": "relative change of W_Q W_Kᵀ",
    "rank": "relative change of W_Q W_Kᵀ",
    "share_qkv": "rms of the relative changes of W_Q W_Kᵀ and W_V W_O",
    "ablate": "relative change of W_V W_O",
}
_GIVES_OWN_KEY = ("share_qk", "tie_q", "symmetric", "share_qkv")  # GQA/MQA: these expand K/V
_SQUARE = ("share_qk", "tie_q", "tie_k", "symmetric", "share_qkv")  # need D == Dk
F64 = torch.float64


def apply_edit(layer: AttentionLayer, edit: Edit, heads: Sequence[int] | None = None, *,
               rotary: Literal["gauge", "offset0"] = "gauge") -> EditResult:
    """The layer with `edit` applied to `heads` (all heads when None); the input is never mutated.

    Computed in float64; the edited tensors are returned in the layer's dtype (heads not edited keep their tensors
    bit for bit). Rotary heads are edited within the gauge that commutes with the rotation (exact at every offset);
    `rotary="offset0"` edits them as if they were not rotary instead, which is exact at offset 0 only and flagged.

    Args:
        layer: one layer in the canonical layout.
        edit: from `parse_edit`.
        heads: query heads to edit.
        rotary: "gauge" (default) or "offset0".

    Returns:
        EditResult: the edited copy (K/V expanded to one head per query head when an edited head needs its own
        key), `offset0_only`, and per edited head the figure `PREDICTORS[edit.name]`.

    Raises:
        EditError: an edit not defined for this layer (cross-attention, no W_O, bad K, bad heads, non-finite
            weights, what q/k norms cannot define: `qknorm.check`).

    Example:
        >>> res = apply_edit(layer, parse_edit("share_qk"), heads=[0, 3])  # doctest: +SKIP
        >>> res.predicted  # shared_qk_distance of heads 0 and 3  # doctest: +SKIP
        {0: 0.61, 3: 0.47}
    """
    # One torch thread: the edit is many small decompositions, and with two threads each LAPACK step ends in a
    # barrier that a descheduled thread stalls (10x slower on a loaded machine; see metrics.factored.threaded).
    with one_thread():
        return _apply(layer, edit, heads, rotary)


def _apply(layer: AttentionLayer, edit: Edit, heads: Sequence[int] | None, rotary: str) -> EditResult:
    idx = _heads(layer, heads)
    _check(layer, edit, idx)
    offset0 = rotary == "offset0" and layer.spec.positional == "rope" and edit.name not in ("ablate", "tie_q", "tie_k")
    # Through q/k norms the one-matrix edits are built on the unrotated form (docs/experiments.md)
    offset0 |= layer.spec.positional == "rope" and qkn.normed(layer) and edit.name in qkn.ONE_MATRIX
    if edit.name == "ablate":
        W_O = layer.W_O.clone()
        W_O[idx] = 0
        new, fig, details = replace(layer, W_O=W_O), torch.ones(len(idx), dtype=F64), {"ov": torch.ones(len(idx))}
    else:
        base = expand_kv(layer) if edit.name in _GIVES_OWN_KEY else layer
        layout = rotary_layout(base, gauge=rotary == "gauge")
        new, fig, details = (_rank if edit.name == "rank" else _qk_edit)(base, idx, layout, edit)
    new = replace(new, extra={**layer.extra, "edits": (*layer.extra.get("edits", ()), (str(edit), tuple(idx)))})
    heads_out = [int(h) for h in idx]
    return EditResult(
        layer=new, offset0_only=offset0, predicted=dict(zip(heads_out, fig.tolist(), strict=True)),
        details={h: {k: float(v[i]) for k, v in details.items()} for i, h in enumerate(heads_out)})


def _heads(layer: AttentionLayer, heads: Sequence[int] | None) -> list[int]:
    H = layer.spec.n_heads
    idx = list(range(H)) if heads is None else [int(h) for h in heads]
    bad = [h for h in idx if not 0 <= h < H]
    if bad or not idx or len(set(idx)) != len(idx):
        raise EditError(f"{layer.block} layer {layer.layer}: heads {idx} must be distinct, in 0..{H - 1}")
    return idx


def check_edit(spec: BlockSpec, edit: Edit, where: str) -> None:
    """EditError where `edit` is not defined for a layer of `spec`: what the block's description (a config, no
    weight) says already, so that `run_experiment` refuses it before loading the model. What q/k norms cannot
    define depends on the layer's norms and the heads chosen (`qknorm.check`, when the layer is edited)."""
    s, name = spec, edit.name
    if name == "rank" and not 0 <= (edit.k or 0) <= s.d_head:
        raise EditError(f"{where}: rank:{edit.k} needs 0 <= K <= d_head = {s.d_head}")
    if name in _SQUARE and s.kv_width != s.d_model:
        raise EditError(f"{where}: {name} needs queries and keys to read the same input (d_model {s.d_model}, "
                        f"key input {s.kv_width})")
    if name == "share_qkv" and s.v_head != s.d_head:
        raise EditError(f"{where}: share_qkv needs value heads as wide as query heads ({s.v_head} != {s.d_head})")


def _check(layer: AttentionLayer, edit: Edit, idx: list[int]) -> None:
    s, name, where = layer.spec, edit.name, f"{layer.block} layer {layer.layer}"
    check_edit(s, edit, where)
    qkn.check(layer, edit, idx)
    if name in ("share_qkv", "ablate") and layer.W_O is None:
        raise EditError(f"{where}: {name} needs the output projection W_O, which this layer does not have")
    kv = layer.kv_index()[idx]
    used = [layer.W_Q[idx], layer.W_K[kv]] + ([layer.W_V[kv], layer.W_O[idx]] if name == "share_qkv" else [])
    if not all(bool(t.isfinite().all()) for t in used):
        raise EditError(f"{where}: heads {idx} have non-finite weights; they cannot be edited")


def _factors(base: AttentionLayer, idx: list[int]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """W_Q, W_K of the heads (n, D, d) and b_Q, b_K (n, d), zeros where absent, in float64."""
    kv = base.kv_index()[idx]
    d = base.spec.d_head

    def bias(b: Tensor | None, rows: Tensor | list[int]) -> Tensor:
        return torch.zeros(len(idx), d, dtype=F64) if b is None else b[rows].to(F64)

    return base.W_Q[idx].to(F64), base.W_K[kv].to(F64), bias(base.b_Q, idx), bias(base.b_K, kv)


def _per_block(layout: RotaryLayout, fn, Wq: Tensor, Wk: Tensor, bq: Tensor, bk: Tensor):
    """Run the block edit `fn` on the real block and on every rotary pair; merge the results back into heads.
    The score form's squared norm averaged over offsets is ||P_real||² + ½ Σ_pairs ||P_pair||²."""
    (rq, cq), (rk, ck) = layout.split(Wq), layout.split(Wk)
    (rbq, cbq), (rbk, cbk) = layout.split_bias(bq), layout.split_bias(bk)
    out, off2, tot2 = [], torch.zeros(len(Wq), dtype=F64), torch.zeros(len(Wq), dtype=F64)
    for blk, weight in ((forms.Block(rq, rk, rbq, rbk), 1.0), (forms.Block(cq, ck, cbq, cbk), 0.5)):
        if blk.A.shape[-1] == 0 or blk.A.shape[1] == 0:  # no real block / no pairs
            out.append(blk)
            continue
        e = fn(blk)
        out.append(e.block)
        off2 += weight * (e.off2 if weight == 1.0 else e.off2.sum(-1))
        tot2 += weight * (e.tot2 if weight == 1.0 else e.tot2.sum(-1))
    r, c = out
    merged = (layout.merge(r.A, c.A), layout.merge(r.B, c.B), layout.merge_bias(r.bq, c.bq),
              layout.merge_bias(r.bk, c.bk))
    return merged, _ratio(off2, tot2)


def _ratio(off2: Tensor, tot2: Tensor) -> Tensor:
    return torch.where(tot2 > 0, (off2 / tot2.clamp_min(torch.finfo(F64).tiny)).clamp_min(0).sqrt(),
                       torch.full_like(tot2, float("nan")))


_FORMS = {"share_qk": forms.share_qk, "share_qkv": forms.share_qk, "symmetric": forms.symmetric,
          "tie_q": lambda b: forms.tie(b, "q"), "tie_k": lambda b: forms.tie(b, "k")}


def _qk_edit(base: AttentionLayer, idx: list[int], layout: RotaryLayout, edit: Edit):
    if edit.name in qkn.ONE_MATRIX and qkn.normed(base):
        kw, qk, Wq = qkn.one_matrix_edit(base, idx, edit.name)
    else:
        (Wq, Wk, bq, bk), qk = _per_block(layout, _FORMS[edit.name], *_factors(base, idx))
        kw = _put(base, idx, W_Q=Wq, b_Q=bq)
        if edit.name != "tie_k":  # tie_k changes only the queries
            kw |= _put(base, idx, W_K=Wk, b_K=bk)
    if edit.name != "share_qkv":
        return replace(base, **kw), qk, {}
    ov_kw, ov = _share_v(base, idx, Wq)
    return replace(base, **kw, **ov_kw), ((qk.square() + ov.square()) / 2).sqrt(), {"qk": qk, "ov": ov}


def _share_v(base: AttentionLayer, idx: list[int], W: Tensor) -> tuple[dict, Tensor]:
    """W_V := W, W_O := pinv(W) W_V W_O (W_V W_O changes least: it becomes its projection onto span W), and b_V
    refitted so that its constant contribution b_V W_O changes least."""
    V, O = base.W_V[idx].to(F64), base.W_O[idx].to(F64)  # (n, D, d), (n, d, D): K/V already one per query head
    C = _pinv_tall(W) @ V  # (n, d, D) @ (n, D, d) -> (n, d, d)
    O_new = C @ O  # (n, d, D)
    X = V - W @ C  # (n, D, d): W_V W_O − W_V' W_O' = X W_O
    OOt = O @ O.mT
    ov = _ratio(_tr(X.mT @ X, OOt), _tr(V.mT @ V, OOt))
    kw = _put(base, idx, W_V=W, W_O=O_new)
    if base.b_V is not None:
        b = (base.b_V[idx].to(F64).unsqueeze(-2) @ O) @ _pinv_tall(O_new.mT).mT  # (n, 1, D) @ (n, D, d)
        kw |= _put(base, idx, b_V=b[..., 0, :])
    return kw, ov


def _pinv_tall(X: Tensor) -> Tensor:
    """Pseudo-inverse of tall X (n, D, d) as pinv(R) Qᵀ from X = QR: a d x d pseudo-inverse instead of an SVD of
    X (Q has orthonormal columns, so (QR)⁺ = R⁺ Qᵀ)."""
    Q, R = torch.linalg.qr(X)
    return torch.linalg.pinv(R) @ Q.mT


def _tr(A: Tensor, B: Tensor) -> Tensor:
    return (A * B.mT).sum((-2, -1))  # tr(A B) per head


def _put(base: AttentionLayer, idx: list[int], **new: Tensor) -> dict[str, Tensor | None]:
    """Copies of `base`'s tensors with rows `idx` replaced, in the stored dtype. A bias the layer lacks is added
    only where the edit makes it nonzero, and never for b_K (it only shifts scores along a query's row)."""
    out: dict[str, Tensor | None] = {}
    for name, t in new.items():
        old = getattr(base, name)
        if old is None:
            if name == "b_K" or not bool(t.any()):
                out[name] = None
                continue
            old = torch.zeros(base.spec.n_heads, t.shape[-1], dtype=base.W_Q.dtype)
        full = old.clone()
        full[idx] = t.to(old.dtype)
        out[name] = full
    return out


def _rank(base: AttentionLayer, idx: list[int], layout: RotaryLayout, edit: Edit):
    """M truncated to K dimensions by changing the queries only (M_K = U_K U_Kᵀ M). Rotary heads: the K dims
    the gauge allows, whole pairs (2 dims each, kept or dropped) and the top singular directions of the real
    block, chosen to keep the most of the offset-averaged ||M||². Through q/k norms: the same on the folded
    factors W_Q diag(g_q), W_K diag(g_k), unfolded afterwards (qknorm)."""
    if qkn.normed(base):
        Wq_f, Wk_f = qkn.fold_queries_keys(base)
        folded = replace(base, W_Q=Wq_f, W_K=Wk_f, q_norm=None, k_norm=None, spec=replace(base.spec, qk_norm=False))
        new, fig, details = _rank(folded, idx, layout, edit)
        return replace(base, W_Q=qkn.unfold_queries(base, new.W_Q, idx)), fig, details
    Wq, Wk, _, _ = _factors(base, idx)
    (rq, cq), (rk, ck) = layout.split(Wq), layout.split(Wk)
    n, k0 = len(idx), rq.shape[-1]
    w = 0.5 * cq.abs().square().sum((-2, -1)) * ck.abs().square().sum((-2, -1))  # (n, P): ½ |u|²|v|²
    sp = forms.spectrum(rq, rk) if k0 else None
    s2 = sp.S.square() if sp is not None else torch.zeros(n, 0, dtype=F64)
    j, k_real = _budget(s2, w, edit.k)
    if sp is not None:
        rq, off2, tot2 = forms.truncate(sp, k_real)
    else:
        off2, tot2 = torch.zeros(n, dtype=F64), torch.zeros(n, dtype=F64)
    kept = w.argsort(-1, descending=True).argsort(-1) < j.unsqueeze(-1)  # (n, P): the j heaviest pairs
    cq = cq * kept[..., None, None]
    off2, tot2 = off2 + (w * ~kept).sum(-1), tot2 + w.sum(-1)
    return replace(base, **_put(base, idx, W_Q=layout.merge(rq, cq))), _ratio(off2, tot2), {}


def _budget(s2: Tensor, w: Tensor, K: int) -> tuple[Tensor, Tensor]:
    """Per head, how many pairs j (2 dims each) and real directions K − 2j keep the most energy: for a given j
    the best choice is the j heaviest pairs and the K − 2j largest σ², so it is enough to try every j."""
    n, m0, P = s2.shape[0], s2.shape[-1], w.shape[-1]
    zero = torch.zeros(n, 1, dtype=F64)
    cs = torch.cat([zero, s2.cumsum(-1)], -1)  # (n, m0 + 1): energy of the top r directions
    cw = torch.cat([zero, w.sort(-1, descending=True).values.cumsum(-1)], -1)  # (n, P + 1)
    J = torch.arange(min(P, K // 2) + 1)
    r = (K - 2 * J).clamp(max=m0)
    best = (cw[:, J] + cs[:, r]).argmax(-1)  # (n,): the first best j
    return J[best], r[best]
