"""bench/run.py's target logic (no timing: that is the benchmark's job): the product routes and layer schedules
(d_best) is the minimum over, the shape a checkpoint's config names, and the verdicts."""

from __future__ import annotations

import sys
import types

import torch

from bench import run


def test_the_backends_bf16_route_is_added_where_it_is_the_best(monkeypatch):
    import qkinspect.metrics

    for best, want in (("bf16", {"float32": torch.float32, "bf16": torch.bfloat16}),
                       ("float32", {"float32": torch.float32})):
        fake = types.ModuleType("qkinspect.metrics.backend")
        fake.best_route = lambda best=best: best
        monkeypatch.setitem(sys.modules, "qkinspect.metrics.backend", fake)
        monkeypatch.setattr(qkinspect.metrics, "backend", fake, raising=False)
        assert run.product_routes() == want


def test_shapes_and_verdicts():
    cfg = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 32}
    assert run.shape_of(cfg) == "llama-7b" and run.RSS_TARGETS["llama-7b"] == 1.5
    assert run.shape_of({**cfg, "num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
                         "num_key_value_heads": 8}) == "llama-70b-attn"
    assert run.shape_of({**cfg, "num_hidden_layers": 3}) is None
    assert (run.verdict(True), run.verdict(False)) == ("PASS", "FAIL")


def test_the_floor_is_also_timed_with_layers_side_by_side_where_analyze_does_so(tmp_path):
    from tests.test_streaming import _bench_writer

    cfg7 = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 32}
    cfg70 = {**cfg7, "num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": 8}
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert (run.layers_at_once(cfg7), run.layers_at_once(cfg70)) == (2, 1)
        torch.set_num_threads(1)
        assert run.layers_at_once(cfg7) == 1
        torch.set_num_threads(2)
        mk = _bench_writer()
        folder = mk.make(mk.Shape(3, 64, 4, 2, d_ff=96, vocab=50, attention_only=True), tmp_path / "tiny", seed=1)
        assert run.gemm_floor(folder, at_once=2) > 0 and run.gemm_floor(folder) > 0  # an odd layer count: 2 + 1
    finally:
        torch.set_num_threads(before)
