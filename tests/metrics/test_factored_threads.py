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


def test_each_calling_thread_has_its_own_pools():
    """Two layers measured side by side, each on a worker with threads of its own, must not queue for one LAPACK
    pool or one decomposition thread."""
    from concurrent.futures import ThreadPoolExecutor

    from qkinspect.metrics.heads import _background

    mine = (_linalg_pool(2), _background())
    with ThreadPoolExecutor(1) as other:
        theirs = other.submit(lambda: (_linalg_pool(2), _background(), _linalg_pool(2), _background())).result()
    assert theirs[0] is theirs[2] and theirs[1] is theirs[3]  # kept for that thread
    assert theirs[0] is not mine[0] and theirs[1] is not mine[1]
    assert mine == (_linalg_pool(2), _background())
