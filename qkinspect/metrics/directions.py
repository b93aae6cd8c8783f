"""Singular directions of a head's W_OV = W_V W_O and W_QK = W_Q W_Kᵀ from their factors, and tokens that read them.

Row-vector convention (ARCHITECTURE.md §2): a head's output for input x is x W_OV, its score between a query x and a key
y is x W_QK yᵀ. For a form M = A Bᵀ with factors A (D, d) and B (D', d): QR of each, A = Q_A R_A, B = Q_B R_B, so
M = Q_A (R_A R_Bᵀ) Q_Bᵀ, and the SVD of the d × d core, R_A R_Bᵀ = U_c S V_cᵀ, gives M = (Q_A U_c) S (Q_B V_c)ᵀ.
No D × D matrix is ever formed; the cost per head is O(D d²).

- Left singular vectors u_i (columns of Q_A U_c): what the head reads (W_OV's read side; W_QK's query side).
- Right singular vectors v_i: what it writes (W_OV's write side; W_QK's key side). x = u_i gives x M = σ_i v_iᵀ.
- Sign: (u_i, v_i) is defined up to a common sign. `canonical_signs` fixes it (the largest-magnitude entry of v_i
  positive) so results repeat; both signs are reported downstream, and + on one side goes with + on the other.
- Degenerate directions: where σ_i / σ_{i+1} < GAP the two directions are not defined on their own (any rotation
  inside their span is as good); `subspaces` groups such runs into blocks, to be read as a subspace. A run that
  reaches past the K directions asked for grows at most K directions further (a flat spectrum chains neighbours
  within 5 % over dozens of directions); `continues` says where a run was cut.
- Readings: a token's score is its vector's dot product with the direction (or the norm of its projection onto a
  subspace); the cosine reading divides by the token vector's norm, so long rows (rare "hub" tokens) do not fill
  every list.
- Zero directions: σ_i <= RANK_RTOL · σ_max (the project's one rank cut) are dropped.
"""

from __future__ import annotations

import torch
from torch import Tensor

from qkinspect.metrics.factored import RANK_RTOL, one_thread

GAP = 1.05  # σ_i / σ_{i+1} below this: directions i and i+1 are read together, as a subspace


def factored_svd(A: Tensor, B: Tensor, keep: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """SVD of M = A Bᵀ per head from its factors, signs canonical.

    Args:
        A: (n, D, d) left factors (W_V, or W_Q).
        B: (n, D', d) right factors (W_Oᵀ, or W_K).
        keep: form only the first `keep` singular vectors (all singular values are given): the rest are never
            read, and forming them is most of the cost after the QR.

    Returns:
        U (n, D, r), S (n, d) decreasing, V (n, D', r), r = min(d, keep): M = U diag(S) Vᵀ (without `keep`).
        A head whose factors hold NaN or inf (or whose core overflows) gets NaN in U, S and V.

    Example:
        >>> A, B = torch.randn(2, 8, 3, dtype=torch.float64), torch.randn(2, 8, 3, dtype=torch.float64)
        >>> U, S, V = factored_svd(A, B)
        >>> torch.allclose(U @ torch.diag_embed(S) @ V.mT, A @ B.mT)
        True
    """
    if A.shape[0] != B.shape[0] or A.shape[-1] != B.shape[-1]:
        raise ValueError(f"factors {tuple(A.shape)} and {tuple(B.shape)} do not pair head by head")
    with one_thread():  # small decompositions one after another: threads would only wait at barriers
        Qa, Ra = torch.linalg.qr(A)  # (n, D, d), (n, d, d)
        Qb, Rb = torch.linalg.qr(B)  # (n, D', d), (n, d, d)
        core = Ra @ Rb.mT  # the (n, d, d) core
        bad = ~torch.isfinite(core).all(dim=(-2, -1))  # (n,): NaN or inf in a factor, or an overflow
        if bool(bad.any()):  # the SVD refuses non-finite input: those heads get NaN singular values and vectors
            core = core.masked_fill(bad[:, None, None], 0.0)
        Uc, S, Vch = torch.linalg.svd(core)
        r = Uc.shape[-1] if keep is None else min(keep, Uc.shape[-1])
        U, V = canonical_signs(Qa @ Uc[..., :r], Qb @ Vch[..., :r, :].mT)  # (n, D, r), (n, D', r)
    if bool(bad.any()):
        S = S.masked_fill(bad[:, None], float("nan"))
        U, V = U.masked_fill(bad[:, None, None], float("nan")), V.masked_fill(bad[:, None, None], float("nan"))
    return U, S, V


def canonical_signs(U: Tensor, V: Tensor) -> tuple[Tensor, Tensor]:
    """(U, V) with each pair (u_i, v_i) flipped so that v_i's entry of largest magnitude is positive."""
    idx = V.abs().argmax(dim=-2, keepdim=True)  # (n, 1, r): where each v_i is largest
    sign = torch.where(V.gather(-2, idx) < 0, -1.0, 1.0).to(V.dtype)  # (n, 1, r)
    return U * sign, V * sign


def subspaces(S: Tensor, k: int, gap: float = GAP, past: int | None = None) -> list[tuple[int, ...]]:
    """The top directions of one head as blocks of indices: a block holds consecutive i with σ_i / σ_{i+1} < gap
    (a single index where the direction stands alone). Blocks are taken in order until they cover `k` directions;
    the block that reaches k grows at most `past` directions beyond the k-th (default k: never more than 2k
    directions in all; `continues` tells a cut run). Directions at or below RANK_RTOL · σ_max are left out.

    Example:
        >>> subspaces(torch.tensor([4.0, 2.0, 1.99, 1.0]), 2)
        [(0,), (1, 2)]
        >>> subspaces(torch.tensor([4.0, 3.9, 3.8, 3.7, 3.6]), 1)  # a chained run, cut 1 past the first
        [(0, 1)]
    """
    s = [float(x) for x in S.tolist()]  # one conversion, not a 0-d tensor per entry
    keep = [i for i, x in enumerate(s) if s and x > RANK_RTOL * s[0]]
    last = k - 1 + (k if past is None else past)  # the last index a block may reach
    out: list[tuple[int, ...]] = []
    i, covered = 0, 0
    while i < len(keep) and covered < k:
        j = i
        while j + 1 < len(keep) and j + 1 <= last and s[j] < gap * s[j + 1]:
            j += 1
        out.append(tuple(range(i, j + 1)))
        covered += j + 1 - i
        i = j + 1
    return out


def continues(S: Tensor, blocks: list[tuple[int, ...]], gap: float = GAP) -> bool:
    """Whether the last block's near-equal run goes on past it (`subspaces` cut it): its σ is within `gap` of the
    next direction's, which is not a zero direction.

    Example:
        >>> S = torch.tensor([4.0, 3.9, 3.8, 3.7, 3.6])
        >>> continues(S, subspaces(S, 1)), continues(S, subspaces(S, 5))
        (True, False)
    """
    if not blocks:
        return False
    j = blocks[-1][-1]
    if len(blocks[-1]) == 1 or j + 1 >= S.shape[0]:
        return False
    s0, sj, after = (float(x) for x in S[[0, j, j + 1]].tolist())
    return after > RANK_RTOL * s0 and sj < gap * after


def token_scores(T: Tensor, W: Tensor, blocks: list[tuple[int, ...]]) -> Tensor:
    """How every token reads each direction or subspace: T (V, D) token vectors, W (D, m) orthonormal columns,
    `blocks` partitioning the columns -> (V, len(blocks)). A single column w: the dot product t·w (signed); a block
    of columns W_b: the norm of the token's projection onto their span, ‖t W_b‖ (sign-free).

    Example:
        >>> T = torch.tensor([[1.0, 0.0, 0.0], [0.0, 3.0, 4.0]])
        >>> token_scores(T, torch.eye(3), [(0,), (1, 2)])
        tensor([[1., 0.],
                [0., 5.]])
    """
    layout = _Layout(blocks)
    single, runs = layout.scores(layout.rows(W, T.dtype) @ T.mT)  # (m, D) @ (D, V): direction-major
    return layout.in_order(torch.cat([single, runs])).mT  # (blocks, V) -> (V, blocks)


class _Layout:
    """The directions of `blocks` reordered for scoring: the single directions' columns first (in block order),
    then the runs' (each run's columns adjacent), so that the products P (m, c), formed direction-major (each
    direction's scores one contiguous row), split into two views without a copy: the singles' rows are their scores,
    the runs' rows are squared in place and summed per run (‖t W_b‖ = √Σ_j (t·w_j)²) by one small product."""

    def __init__(self, blocks: list[tuple[int, ...]]):
        self.single = [k for k, b in enumerate(blocks) if len(b) == 1]
        self.runs = [k for k, b in enumerate(blocks) if len(b) > 1]
        self.columns = [c for k in self.single + self.runs for c in blocks[k]]
        self.sizes = [len(blocks[k]) for k in self.runs]
        order = self.single + self.runs  # block k's scores are at row order.index(k) of the joined scores
        self.back = torch.empty(len(order), dtype=torch.long)
        self.back[torch.tensor(order, dtype=torch.long)] = torch.arange(len(order))

    def rows(self, W: Tensor, dtype: torch.dtype) -> Tensor:
        """W's columns in this order, as rows: (m, D)."""
        return W.mT[self.columns].to(dtype).contiguous()

    def scores(self, P: Tensor) -> tuple[Tensor, Tensor]:
        """(single directions' scores (s, c), runs' norms (r, c)) from the products P (m, c), which this squares."""
        n = len(self.single)
        if not self.runs:
            return P, P[:0]
        member = torch.block_diag(*[P.new_ones(1, size) for size in self.sizes])  # (runs, run rows) of 0/1
        return P[:n], (member @ P[n:].square_()).sqrt_()

    def in_order(self, x: Tensor) -> Tensor:
        """Rows in this layout's order (singles, then runs) back in the blocks' order."""
        return x[self.back.to(x.device)]


CHUNK = 16384  # tokens scored at a time at least
CHUNK_BYTES = 64 << 20  # the (m, chunk) scores of one chunk at most (when more than CHUNK tokens): every vocabulary
# up to this size in one product (SmolLM2's 49,152 tokens for up to 340 directions), a 262k one in a few


def best_tokens(T: Tensor, W: Tensor, blocks: list[tuple[int, ...]], n: int, chunk: int | None = None,
                norms: Tensor | None = None) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """The n best tokens of every block (`token_scores`), scored `chunk` tokens at a time: ((values, ids) of the
    highest scores, (values, ids) of the lowest, negated: the tokens of −v), each (n, blocks); the lowest are given
    for single directions only (columns in the order of the single blocks). A token's score is the same whichever
    chunk holds it, so the result is that of one pass over all tokens. `norms` (V,): the token vectors' norms, for
    the cosine reading (each score divided by its token's norm; a zero row scores 0). `chunk`: tokens a time
    (default: as many as CHUNK_BYTES of scores hold, at least CHUNK).

    Each chunk's products are formed direction-major (`_Layout`), so that every pass after them (the runs' norms,
    the top-k) reads contiguous rows, with no copy of the products: the products are the floor of this step. Those
    passes run on one thread (memory-bound: on a busy machine the threads' barriers cost more than they bring)."""
    layout = _Layout(blocks)
    Wt = layout.rows(W, T.dtype)  # (m, D)
    if chunk is None:
        chunk = max(CHUNK, CHUNK_BYTES // max(1, Wt.shape[0] * Wt.element_size()))
    k = min(n, T.shape[0])
    hi_v, hi_i, lo_v, lo_i = [], [], [], []
    for a in range(0, T.shape[0], chunk):
        P = Wt @ T[a:a + chunk].mT  # (m, c)
        with one_thread():
            single, runs = layout.scores(P)
            if norms is not None:
                scale = norms[None, a:a + chunk].clamp_min(torch.finfo(P.dtype).tiny)
                single, runs = single / scale, runs / scale
            c = min(k, P.shape[1])
            found = [torch.topk(x, c, dim=1) for x in (single, runs)]  # (s, c), (r, c)
            hi_v.append(torch.cat([found[0][0], found[1][0]]))
            hi_i.append(torch.cat([found[0][1], found[1][1]]) + a)
            if layout.single:
                v, i = torch.topk(single, c, dim=1, largest=False)
                lo_v.append(v)
                lo_i.append(i + a)
    hi = _merged(layout.in_order(torch.cat(hi_v, dim=1)), layout.in_order(torch.cat(hi_i, dim=1)), n, largest=True)
    lo = _merged(torch.cat(lo_v, dim=1), torch.cat(lo_i, dim=1), n, largest=False) if layout.single else \
        (hi[0][:, :0], hi[1][:, :0])
    return hi, (-lo[0], lo[1])


def _merged(values: Tensor, ids: Tensor, n: int, largest: bool) -> tuple[Tensor, Tensor]:
    """The n most extreme of the chunks' candidates (values (blocks, candidates)), with their token ids, as
    (n, blocks): the most extreme first."""
    v, at = torch.topk(values, min(n, values.shape[1]), dim=1, largest=largest)
    return v.mT, ids.gather(1, at).mT


__all__ = ["GAP", "CHUNK", "factored_svd", "canonical_signs", "subspaces", "continues", "token_scores",
           "best_tokens"]
