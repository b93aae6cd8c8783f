"""The behaviour scores of one layer's attention against dense references (loops over positions), and their
identities as hypothesis properties: every score in [0, 1], entropy 1 for even attention and 0 for one key."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkinspect.heads.scores import positional, repeated, summary


def attention(B: int, H: int, T: int, causal: bool, seed: int = 0, sharp: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, H, T, T, generator=g) * sharp
    if causal:
        logits = logits.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
    return logits.softmax(-1)


def dense_positional(A: torch.Tensor, causal: bool) -> dict[str, torch.Tensor]:
    B, H, T, _ = A.shape
    out = {k: torch.zeros(B, H, dtype=torch.float64) for k in ("previous_token", "self", "first_token", "entropy")}
    for b in range(B):
        for h in range(H):
            prev = [A[b, h, p, p - 1].item() for p in range(1, T)]
            start = 1 if causal else 0
            diag = [A[b, h, p, p].item() for p in range(start, T)]
            first = [A[b, h, p, 0].item() for p in range(1, T)]
            ent = []
            for p in range(start, T):
                keys = p + 1 if causal else T
                row = [A[b, h, p, j].item() for j in range(keys)]
                ent.append(-sum(a * math.log(a) for a in row if a > 0) / math.log(keys))
            for k, v in (("previous_token", prev), ("self", diag), ("first_token", first), ("entropy", ent)):
                out[k][b, h] = sum(v) / len(v)
    return out


def dense_repeated(A: torch.Tensor, prefix: int, n: int) -> dict[str, torch.Tensor]:
    B, H = A.shape[:2]
    ind = torch.zeros(B, H, dtype=torch.float64)
    dup = torch.zeros(B, H, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            qs = range(prefix + n, prefix + 2 * n)  # the second copy; its token's earlier occurrence is p - n
            ind[b, h] = sum(A[b, h, p, p - n + 1].item() for p in qs) / n
            dup[b, h] = sum(A[b, h, p, p - n].item() for p in qs) / n
    return {"induction": ind, "duplicate_token": dup}


@pytest.mark.parametrize("causal", [True, False])
def test_positional_scores_match_the_dense_reference(causal):
    A = attention(3, 4, 9, causal)
    got, want = positional(A, causal=causal), dense_positional(A, causal)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("prefix", [0, 1])
def test_repeated_scores_match_the_dense_reference(prefix):
    n = 5
    A = attention(2, 3, prefix + 2 * n + 1, True)
    got, want = repeated(A, prefix=prefix, n=n, causal=True), dense_repeated(A, prefix, n)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-6, atol=1e-7)


def test_an_encoder_has_no_induction_score():
    A = attention(1, 2, 12, False)
    got = repeated(A, prefix=1, n=5, causal=False)
    assert got["induction"] is None
    torch.testing.assert_close(got["duplicate_token"], dense_repeated(A, 1, 5)["duplicate_token"])


def test_known_patterns_score_one():
    T = 8
    shift = torch.zeros(T, T)
    shift[0, 0] = 1
    for p in range(1, T):
        shift[p, p - 1] = 1
    assert positional(shift.expand(1, 1, T, T), causal=True)["previous_token"].item() == pytest.approx(1.0)
    n = 3  # a perfect induction head on 2 x 3 tokens after BOS: p attends to p - n + 1 in the second copy
    A = torch.zeros(1, 1, 1 + 2 * n, 1 + 2 * n)
    for p in range(1 + 2 * n):
        A[0, 0, p, p - n + 1 if p >= 1 + n else 0] = 1
    got = repeated(A, prefix=1, n=n, causal=True)
    assert got["induction"].item() == pytest.approx(1.0) and got["duplicate_token"].item() == 0.0


def test_summary_is_the_mean_and_its_standard_error():
    x = torch.tensor([[1.0], [2.0], [4.0]], dtype=torch.float64)
    mean, se = summary(x)
    assert mean.item() == pytest.approx(7 / 3)
    assert se.item() == pytest.approx(torch.tensor([1.0, 2.0, 4.0]).std().item() / math.sqrt(3))
    assert math.isnan(summary(x[:1])[1].item())


@settings(max_examples=40, deadline=None)
@given(B=st.integers(1, 3), H=st.integers(1, 3), T=st.integers(2, 12), causal=st.booleans(),
       sharp=st.floats(0.0, 30.0), seed=st.integers(0, 2**16))
def test_every_score_lies_in_zero_one(B, H, T, causal, sharp, seed):
    A = attention(B, H, T, causal, seed, sharp)
    for v in positional(A, causal=causal).values():
        assert bool(((v >= -1e-6) & (v <= 1 + 1e-6)).all())  # float32 probabilities
    n = T // 2
    if n >= 1:
        for v in repeated(A, prefix=T - 2 * n, n=n, causal=causal).values():
            if v is not None:
                assert bool(((v >= -1e-6) & (v <= 1 + 1e-6)).all())  # float32 probabilities


@settings(max_examples=20, deadline=None)
@given(T=st.integers(2, 16), causal=st.booleans())
def test_entropy_is_one_for_even_attention_and_zero_for_one_key(T, causal):
    mask = torch.ones(T, T).tril() if causal else torch.ones(T, T)
    even = (mask / mask.sum(-1, keepdim=True)).expand(1, 1, T, T)
    assert positional(even, causal=causal)["entropy"].item() == pytest.approx(1.0)
    one = torch.eye(T).expand(1, 1, T, T)
    assert positional(one, causal=causal)["entropy"].item() == pytest.approx(0.0, abs=1e-12)
