"""The LAPACK worker pool of qkinspect.metrics.factored: kept for the process, one torch thread per worker, and
the caller's thread count untouched."""

from __future__ import annotations

import torch

from qkinspect.metrics.factored import _linalg_pool, eigvalsh, threaded


def _parallel_op_then_count() -> int:
    torch.ones(1 << 16).sum()  # a parallel operation: torch would (re)initialise an uninitialised thread here
    return torch.get_num_threads()


def test_workers_run_torch_on_one_thread_after_the_caller_restores_its_count():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        pool = _linalg_pool(2)
        counts = [pool.submit(_parallel_op_then_count).result() for _ in range(4)]
        assert counts == [1, 1, 1, 1]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_pool_is_kept_between_calls():
    assert _linalg_pool(2) is _linalg_pool(2)


def test_threaded_matches_one_call_and_leaves_the_thread_count():
    torch.manual_seed(0)
    X = torch.randn(12, 40, 6, dtype=torch.float64)
    G = X.mT @ X  # (12, 6, 6)
    before = torch.get_num_threads()
    assert torch.allclose(eigvalsh(G), torch.linalg.eigvalsh(G))
    L, info = threaded(torch.linalg.cholesky_ex, G)  # a tuple result, concatenated per element
    assert torch.allclose(L, torch.linalg.cholesky(G)) and bool((info == 0).all())
    assert torch.get_num_threads() == before
