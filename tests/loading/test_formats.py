"""PyTorch .bin specifics, storage dtype and attention bytes in ModelInfo."""

from __future__ import annotations

import pytest
import torch

from qkinspect.errors import CheckpointError
from qkinspect.layer import AttentionLayer, BlockSpec
from qkinspect.loading import open_model
from qkinspect.loading.adapters.base import Adapter, heads_in, heads_out
from qkinspect.loading.model import LoadedModel
from qkinspect.loading.resolve import Resolved
from qkinspect.loading.torchbin import TorchBinSource, load_state_dict
from tests.loading import tiny


def test_bin_legacy_format_without_zip(tmp_path):
    """Files from torch < 1.6 are plain pickles: they cannot be memory-mapped but still load (weights only)."""
    _, state = tiny.bert()
    f = tmp_path / "pytorch_model.bin"
    torch.save(state, f, _use_new_zipfile_serialization=False)
    src = TorchBinSource([f])
    name = "encoder.layer.0.attention.self.query.weight"
    assert torch.equal(src.get(name), state[name])


def test_bin_state_dict_wrapper_and_non_tensors(tmp_path):
    f = tmp_path / "ckpt.bin"
    torch.save({"state_dict": {"w": torch.ones(2, 3), "step": 7}, "epoch": 3}, f)
    assert list(load_state_dict(f)) == ["w"]


@pytest.mark.parametrize(("obj", "message"), [({"step": 7}, "holds no tensors"), ([torch.ones(2)], "holds a list")])
def test_bin_without_a_state_dict(tmp_path, obj, message):
    f = tmp_path / "x.bin"
    torch.save(obj, f)
    with pytest.raises(CheckpointError, match=message):
        load_state_dict(f)


def test_bin_tensors_are_copies_not_views_of_the_mapping(tmp_path):
    _, state = tiny.bert()
    f = tmp_path / "pytorch_model.bin"
    torch.save(state, f)
    src = TorchBinSource([f])
    name = "encoder.layer.0.attention.self.query.weight"
    t = src.get(name)
    src.release(f)
    assert not src._loaded and torch.equal(t, state[name])


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_mixed_storage_dtypes_are_listed(tmp_path, fmt):
    config, state = tiny.bert()
    for i in range(2):
        name = f"encoder.layer.{i}.attention.self.query.weight"
        state[name] = state[name].half()
    with open_model(tiny.write(tmp_path / "m", config, state, fmt=fmt)) as m:
        assert m.info.dtype == "float16+float32"
        assert m.info.attention_bytes == 2 * (32 * 32 * 2 + 3 * 32 * 32 * 4)
        assert m.layer("encoder", 0).W_Q.dtype == torch.float16  # as stored: no cast while loading


class SharedAdapter(Adapter):
    """Two layers reading the same tensors (as ALBERT does): their bytes count once."""

    model_types = ("shared-test",)

    def blocks(self):
        return [BlockSpec("encoder", n_layers=2, n_heads=2, n_kv_heads=2, d_model=4, d_head=2)]

    def tensor_names(self, block, layer):
        return ["q", "k", "v", "o"]

    def build(self, block, layer, t):
        return AttentionLayer(self.spec(block), layer, W_Q=heads_in(t["q"], 2, 2), W_K=heads_in(t["k"], 2, 2),
                              W_V=heads_in(t["v"], 2, 2), W_O=heads_out(t["o"], 2, 2))  # (4, 4) -> per head


def test_shared_tensors_count_once():
    from types import SimpleNamespace

    from qkinspect.loading.source import DictSource

    src = DictSource({n: torch.randn(4, 4) for n in "qkvo"})
    config = SimpleNamespace(model_type="shared-test")
    m = LoadedModel(Resolved("x", tiny.Path("x"), "safetensors", config, src), SharedAdapter(config))
    assert (m.info.dtype, m.info.attention_bytes) == ("float32", 4 * 16 * 4)
    assert [layer.layer for layer in m.layers()] == [0, 1]
