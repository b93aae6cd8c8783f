"""One layer in memory at a time, shards released once no later layer needs them, and the prefetch thread."""

from __future__ import annotations

import threading
import weakref

import pytest
import torch

from qkinspect.errors import CheckpointError
from qkinspect.loading import open_model
from qkinspect.loading.adapters.bert import BertAdapter
from qkinspect.loading.model import LoadedModel
from qkinspect.loading.resolve import Resolved
from qkinspect.loading.source import DictSource
from tests.loading import tiny


class SpySource(DictSource):
    """Hands out fresh copies and counts how many are alive; can fail or signal on chosen tensors."""

    def __init__(self, tensors, fail_on=None, signal_on=None):
        super().__init__(tensors)
        self.alive = 0
        self.peak = 0
        self.fail_on, self.signal_on = fail_on, signal_on
        self.event = threading.Event()
        self.reader_threads: set[str] = set()

    def _read(self, stored_name):
        self.reader_threads.add(threading.current_thread().name)
        if stored_name == self.fail_on:
            raise CheckpointError(f"cannot read {stored_name}")
        if stored_name == self.signal_on:
            self.event.set()
        t = self.tensors[stored_name].clone()
        self.alive += 1
        self.peak = max(self.peak, self.alive)
        weakref.finalize(t, self._dead)
        return t

    def _dead(self):
        self.alive -= 1


def spy_model(n_layers=4, **kw) -> tuple[LoadedModel, SpySource]:
    config, state = tiny.bert(num_hidden_layers=n_layers)
    src = SpySource(state, **kw)
    return LoadedModel(Resolved("spy", tiny.Path("spy"), "safetensors", config, src), BertAdapter(config)), src


PER_LAYER = 10  # BERT: q/k/v/o weights and biases, and the LayerNorm weight and bias feeding the layer


@pytest.mark.parametrize(("prefetch", "most"), [(False, PER_LAYER), (True, 2 * PER_LAYER)])
def test_layers_hold_one_layer_at_a_time(prefetch, most):
    m, src = spy_model()
    seen = []
    for layer in m.layers(prefetch=prefetch):
        seen.append(src.alive)
        del layer
    assert len(seen) == 4 and max(seen) <= most and src.peak <= most
    assert src.alive == 0  # the loader keeps nothing once iteration ends
    if not prefetch:
        assert seen == [PER_LAYER] * 4 and src.peak == PER_LAYER


def test_prefetch_reads_next_layer_while_caller_works():
    m, src = spy_model(signal_on="encoder.layer.1.attention.self.query.weight")
    it = m.layers(prefetch=True)
    first = next(it)
    # The caller has layer 0 and does nothing: layer 1 must be read meanwhile, in the worker thread.
    assert src.event.wait(timeout=20), "layer 1 was not read while the caller held layer 0"
    assert first.layer == 0
    assert [layer.layer for layer in it] == [1, 2, 3]
    assert any(name.startswith("qkinspect-prefetch") for name in src.reader_threads)


def test_prefetch_gives_the_same_layers():
    m, _ = spy_model()
    plain = list(m.layers())
    fetched = list(m.layers(prefetch=True))
    for a, b in zip(plain, fetched, strict=True):
        assert (a.layer, a.block) == (b.layer, b.block)
        for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
            assert torch.equal(getattr(a, name), getattr(b, name))


def _prefetch_threads():
    return [t for t in threading.enumerate() if t.name.startswith("qkinspect-prefetch")]


def test_prefetch_error_is_raised_in_caller():
    m, _ = spy_model(fail_on="encoder.layer.2.attention.self.key.weight")
    got = []
    with pytest.raises(CheckpointError, match="cannot read encoder.layer.2.attention.self.key.weight"):
        for layer in m.layers(prefetch=True):
            got.append(layer.layer)
    assert got == [0, 1]
    assert not _prefetch_threads()


def test_prefetch_stopped_early_leaves_no_thread():
    m, _ = spy_model()
    it = m.layers(prefetch=True)
    next(it)
    it.close()
    assert not _prefetch_threads()


# -- shards ---------------------------------------------------------------------------------------------------


def open_shards(m) -> set[str]:
    held = getattr(m.source, "_handles", None)
    if held is None:
        held = m.source._loaded
    return {p.name for p in held}


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_shards_released_once_no_later_layer_needs_them(tmp_path, fmt):
    config, state = tiny.bert(num_hidden_layers=3)
    folder = tiny.write(tmp_path / "m", config, state, fmt=fmt, shards=3)
    stem, ext = ("model", "safetensors") if fmt == "safetensors" else ("pytorch_model", "bin")
    shard = [f"{stem}-0000{j}-of-00003.{ext}" for j in (1, 2, 3)]
    with open_model(folder) as m:
        assert open_shards(m) == set()  # headers read at open; nothing stays mapped
        held = [open_shards(m) for _ in m.layers()]
        # Layer i's attention lives in shard i; the LayerNorm feeding layer i (BERT is post-LN) in shard i-1.
        assert held == [{shard[0]}, {shard[1]}, set()]
        assert m.layer("encoder", 0).layer == 0  # random access still works: the shard is opened again
        assert open_shards(m) == {shard[0]}


def test_info_counts_bytes_and_dtype_from_headers_without_reading(tmp_path, monkeypatch):
    from qkinspect.loading.source import SafetensorsSource

    config, state = tiny.bert()
    state = {k: v.to(torch.bfloat16) for k, v in state.items()}
    folder = tiny.write(tmp_path / "m", config, state)

    def no_read(self, name):
        raise AssertionError(f"read {name} while opening")

    monkeypatch.setattr(SafetensorsSource, "_read", no_read)
    with open_model(folder) as m:
        assert m.info.dtype == "bfloat16"
        assert m.info.attention_bytes == 2 * 4 * 32 * 32 * 2  # layers * (q, k, v, o) * D * D * 2 bytes
