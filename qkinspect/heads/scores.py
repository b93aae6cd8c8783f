"""The behaviour scores of every head of one layer, from that layer's attention probabilities (pure torch: a
batch of attention patterns in, one score per sequence and head out; docs/heads.md has the definitions).

`A` is what the model's own attention module returns with attn_implementation="eager": (B, H, T, T), rows the
query positions, columns the key positions, each row summing to 1. Each score of a sequence is a mean over its
query positions; the scores over sequences give the mean and its standard error (`summary`).

- previous-token: A[p, p−1], over the queries p ≥ 1 (TransformerLens's previous-token pattern);
- self: A[p, p], over the queries that see more than one key (p ≥ 1 in a causal model; every p in an encoder);
- first-token: A[p, 0], over the queries p ≥ 1 (the "attention sink" on BOS or [CLS]);
- entropy: −Σ_j A[p, j] log A[p, j] / log k_p, k_p the keys the mask leaves query p (p + 1 causal, T encoder),
  over the queries with k_p ≥ 2: 0 = one key, 1 = spread evenly;
- induction (causal only) and duplicate-token, on `prefix` tokens followed by n random tokens repeated once:
  over the queries p of the second copy, A[p, p − n + 1] (the token after the previous occurrence: Olsson et al.
  2022) and A[p, p − n] (the previous occurrence itself).

Example:
    >>> A = torch.eye(4).expand(1, 2, 4, 4)  # every query attends to itself
    >>> positional(A, causal=True)["self"].tolist()
    [[1.0, 1.0]]
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

POSITIONAL = ("previous_token", "self", "first_token", "entropy")  # measured on text windows
REPEATED = ("induction", "duplicate_token")  # measured on repeated random sequences
SCORES = POSITIONAL + REPEATED


def positional(A: Tensor, *, causal: bool) -> dict[str, Tensor]:
    """previous-token, self, first-token and entropy of each (sequence, head): (B, H) float64 each."""
    T = A.shape[-1]
    if T < 2:
        raise ValueError("positional scores need sequences of at least 2 positions")
    start = 1 if causal else 0  # a causal query 0 sees one key only
    # diagonals and columns are views: only they are cast to float64, never the (B, H, T, T) probabilities
    diag = A.diagonal(dim1=-2, dim2=-1).double()  # (B, H, T): A[p, p]
    out = {"previous_token": A.diagonal(offset=-1, dim1=-2, dim2=-1).double().mean(-1),  # A[p, p-1], p = 1..T-1
           "self": diag[..., start:].mean(-1),
           "first_token": A[..., 1:, 0].double().mean(-1)}
    h = -torch.special.xlogy(A, A).sum(-1).double()  # (B, H, T), 0 log 0 = 0; T float32 terms per row
    keys = torch.arange(1, T + 1, dtype=h.dtype) if causal else torch.full((T,), float(T), dtype=h.dtype)
    out["entropy"] = (h[..., start:] / keys[start:].log()).mean(-1)
    return out


def repeated(A: Tensor, *, prefix: int, n: int, causal: bool) -> dict[str, Tensor]:
    """induction (None for an encoder: it sees the repeated token itself) and duplicate-token of each (sequence,
    head) on sequences laid out as `prefix` tokens, n random tokens and the same n again: (B, H) float64 each."""
    T = A.shape[-1]
    if n < 1 or prefix + 2 * n > T:
        raise ValueError(f"a repeated sequence of 2 x {n} tokens after {prefix} does not fit {T} positions")
    # the diagonal at offset -k holds A[p, p-k] for p = k..T-1, at index p - k; the second copy is p = prefix+n..
    dup = A.diagonal(offset=-n, dim1=-2, dim2=-1)[..., prefix:prefix + n].double()
    out = {"duplicate_token": dup.mean(-1), "induction": None}
    if causal and n >= 2:
        ind = A.diagonal(offset=-(n - 1), dim1=-2, dim2=-1)[..., prefix + 1:prefix + n + 1].double()
        out["induction"] = ind.mean(-1)
    return out


def summary(per_sequence: Tensor) -> tuple[Tensor, Tensor]:
    """The mean over sequences (dim 0) and its standard error s/√n (NaN with one sequence)."""
    n = per_sequence.shape[0]
    mean = per_sequence.mean(0)
    se = per_sequence.std(0, correction=1) / math.sqrt(n) if n > 1 else torch.full_like(mean, float("nan"))
    return mean, se
