"""Layers measured side by side on worker threads (CPU, two or more threads, layers small enough) give the results of
measuring them one after another, in the same order, with errors raised and the memory policy kept."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import qkinspect
from qkinspect.analysis import engine as analysis
from qkinspect.layer import BlockSpec
from qkinspect.metrics.factored import cached

demo = pytest.importorskip("qkinspect.demo")


@pytest.fixture(scope="module")
def demo_dir():
    try:
        return demo.demo_path()
    except qkinspect.QkinspectError as e:
        pytest.skip(str(e))


def _spec(D: int, H: int, G: int, d: int) -> BlockSpec:
    return BlockSpec("decoder", 32, H, G, D, d)


def _run(device: str = "cpu", dtype: torch.dtype = torch.float32, needs_o: bool = False):
    return SimpleNamespace(device=device, dtype=dtype, needs_o=needs_o)


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_policy_two_7b_layers_at_once_on_two_cores_but_one_70b_layer(two_threads):
    seven = _spec(4096, 32, 32, 128)  # q/k/v 192 MiB in float32
    seventy = _spec(8192, 64, 8, 128)  # 320 MiB
    assert analysis._layers_at_once(_run(), [seven], 32) == 2
    assert analysis._layers_at_once(_run(), [seventy], 80) == 1
    assert analysis._layers_at_once(_run(dtype=torch.float64), [seven], 32) == 1  # 384 MiB
    assert analysis._layers_at_once(_run(needs_o=True), [seven], 32) == 2  # W_O as well: 256 MiB, two fit
    assert analysis._layers_at_once(_run(needs_o=True), [_spec(4096, 32, 32, 160)], 32) == 1  # 320 MiB
    assert analysis._layers_at_once(_run(device="cuda"), [seven], 32) == 1
    assert analysis._layers_at_once(_run(), [seven], 1) == 1
    assert analysis._layers_at_once(_run(), [_spec(384, 12, 12, 32)], 12) == 2  # never more than the threads
    torch.set_num_threads(1)
    assert analysis._layers_at_once(_run(), [seven], 32) == 1


def test_side_by_side_equals_one_after_another(demo_dir):
    """threads=2 measures two layers at once (each on one thread), threads=1 one after another: the same records
    in the same order, the same baselines, warnings and processing, values equal to float32 rounding."""
    done: list[tuple[int, int]] = []
    two = qkinspect.analyze(demo_dir, threads=2, spectra=("qk", "q"), progress=lambda i, n: done.append((i, n)))
    one = qkinspect.analyze(demo_dir, threads=1, spectra=("qk", "q"))
    assert done == [(i, 6) for i in range(7)]  # 0, then after each layer, in order
    assert [(h.layer, h.head, h.kv_head) for h in two.heads] == [(h.layer, h.head, h.kv_head) for h in one.heads]
    for a, b in zip(two.heads, one.heads, strict=True):
        assert a.values.keys() == b.values.keys()
        np.testing.assert_allclose(list(a.values.values()), list(b.values.values()), rtol=2e-6, atol=1e-7)
        assert (a.rank_q, a.rank_k, a.rank_v) == (b.rank_q, b.rank_k, b.rank_v)
    assert [r.layer for r in two.layers] == list(range(6))
    for a, b in zip(two.layers, one.layers, strict=True):
        np.testing.assert_allclose(list(a.values.values()), list(b.values.values()), rtol=2e-6)
    assert two.spectra.keys() == one.spectra.keys()
    for key in one.spectra:
        np.testing.assert_allclose(two.spectra[key]["q"], one.spectra[key]["q"], rtol=2e-6, atol=1e-6)
    assert [(b.block, b.metric, b.n) for b in two.baselines] == [(b.block, b.metric, b.n) for b in one.baselines]
    np.testing.assert_allclose([b.mean for b in two.baselines], [b.mean for b in one.baselines], rtol=1e-5)
    assert two.warnings == one.warnings and two.processing == one.processing


def test_an_error_in_one_layer_is_raised_and_the_workers_stay_usable(demo_dir, monkeypatch):
    measure = analysis._Run.measure
    started: list[int] = []

    def failing(self, layer):
        started.append(layer.layer)
        if layer.layer == 2:
            raise qkinspect.QkinspectError("layer 2 is broken")
        return measure(self, layer)

    monkeypatch.setattr(analysis._Run, "measure", failing)
    with pytest.raises(qkinspect.QkinspectError, match="layer 2 is broken"):
        qkinspect.analyze(demo_dir, threads=2, metrics=["symmetry"])
    assert 2 in started and max(started) <= 3  # stopped: at most the layer beside the broken one was started
    monkeypatch.setattr(analysis._Run, "measure", measure)
    result = qkinspect.analyze(demo_dir, threads=2, metrics=["symmetry"], layers="0-1")
    assert [r.layer for r in result.layers] == [0, 1]


def test_cached_attributes_of_two_instances_compute_at_once():
    """functools.cached_property (Python < 3.12) holds one lock per attribute across all instances while it
    computes, so two layers' Grams would be formed in turn; `cached` holds none."""
    both_inside = threading.Barrier(2, timeout=10)

    class Layer:
        @cached
        def gram(self) -> int:
            both_inside.wait()  # BrokenBarrierError after 10 s if the other thread cannot get in
            return 7

    layers = [Layer(), Layer()]
    out: list[int] = []
    threads = [threading.Thread(target=lambda x=x: out.append(x.gram)) for x in layers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert out == [7, 7]
    assert all(vars(x)["gram"] == 7 for x in layers)  # stored in the instance, as cached_property does


def test_workers_with_threads_of_their_own_give_the_same_results(demo_dir, monkeypatch):
    """threads=4 with room for two layers: two workers of two threads each, so each layer's Grams are decomposed
    in its worker's own background thread and LAPACK pool while its products are formed."""
    one = qkinspect.analyze(demo_dir, threads=1, layers="0-3")
    widest = 384 * 384 * 3 * 4  # MiniLM's q/k/v in float32
    monkeypatch.setattr(analysis, "PARALLEL_BYTES", 2 * widest)
    seen = []
    measure = analysis._Run.measure

    def spy(self, layer):
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        return measure(self, layer)

    monkeypatch.setattr(analysis._Run, "measure", spy)
    four = qkinspect.analyze(demo_dir, threads=4, layers="0-3")
    assert {n for _, n in seen} == {2} and all(name.startswith("qkinspect-worker") for name, _ in seen)
    for a, b in zip(four.heads, one.heads, strict=True):
        np.testing.assert_allclose(list(a.values.values()), list(b.values.values()), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("H, G", [(4, 4), (4, 2)])
def test_the_background_maps_name_what_each_metric_reads(H, G):
    """heads._CROSS and heads._WHITENED (which cross products and whiteners `_decompose_meanwhile` forms ahead of
    the metrics) say what each metric really reads: a metric computed alone on fresh products forms exactly those."""
    from qkinspect.metrics import heads
    from qkinspect.metrics.products import HeadProducts
    from tests.metrics.helpers import make_layer

    layer = make_layer(0, H=H, G=G, D=12, d=3)
    for name, metric in heads.HEAD_METRICS.items():
        p = HeadProducts(layer, dtype=torch.float64)
        metric(p)
        crosses = {c for c in heads._CROSS if c in vars(p)}
        whitened = {f for f in heads._WHITENED if f in vars(p) and "whitener" in vars(vars(p)[f])}
        assert crosses == {c for c, readers in heads._CROSS.items() if name in readers}, name
        assert whitened == {f for f, readers in heads._WHITENED.items() if name in readers}, name
