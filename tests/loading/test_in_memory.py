"""Models in memory: a transformers PreTrainedModel or a (config, state_dict) pair, read in place, give the records
the same model saved with save_pretrained gives."""

from __future__ import annotations

import math

import pytest
import torch

import qkinspect
from qkinspect.errors import InputError
from qkinspect.loading import load, open_model

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, vocab_size=40,
            max_position_embeddings=32)


def _bert():
    from transformers import BertConfig, BertForMaskedLM

    return BertForMaskedLM(BertConfig(**TINY))


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=40, n_positions=32))


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(**TINY, num_key_value_heads=2, head_dim=16))  # grouped-query


def _qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    m = Qwen3ForCausalLM(Qwen3Config(**TINY, num_key_value_heads=2, head_dim=16))
    with torch.no_grad():  # q/k norm gains that are not all ones, so a mix-up shows
        for name, p in m.named_parameters():
            if "q_norm" in name or "k_norm" in name:
                p.uniform_(0.5, 1.5)
    return m


FAMILIES = {"bert": _bert, "gpt2": _gpt2, "llama": _llama, "qwen3": _qwen3}


def _same(a, b) -> bool:
    return all((math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(a, b, strict=True))


def _rows(result):
    return [((h.block, h.layer, h.head, h.kv_head), list(h.values.values())) for h in result.heads]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_in_memory_equals_saved(family, tmp_path):
    torch.manual_seed(0)
    model = FAMILIES[family]()
    model.save_pretrained(tmp_path)
    kw = dict(metrics=["all"], layer_form=True, fold_ln=True, fold_qk_norm=family == "qwen3")
    from_memory = qkinspect.analyze(model, **kw)
    saved = qkinspect.analyze(str(tmp_path), **kw)
    assert from_memory.model.format == "memory"
    assert from_memory.model.source == f"memory:{type(model).__name__}"
    assert from_memory.model.blocks == saved.model.blocks
    assert from_memory.metric_names == saved.metric_names
    got, want = _rows(from_memory), _rows(saved)
    assert [k for k, _ in got] == [k for k, _ in want]
    assert all(_same(a, b) for (_, a), (_, b) in zip(got, want, strict=True))
    assert all(_same(list(a.values.values()), list(b.values.values()))
               for a, b in zip(from_memory.layers, saved.layers, strict=True))
    pair = qkinspect.analyze((model.config, model.state_dict()), **kw)
    assert all(_same(a, b) for (_, a), (_, b) in zip(_rows(pair), want, strict=True))


def test_tensors_are_read_in_place():
    """No copy of the model: every tensor handed to the adapter shares storage with one of the model's parameters,
    and a layer read without a cast holds views of them."""
    torch.manual_seed(0)
    model = _llama()
    storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with open_model(model) as m:
        read = [m.source.get(n) for n in m.adapter.tensor_names("decoder", 0)]
        assert read and all(t.untyped_storage().data_ptr() in storages for t in read)
    layer = next(iter(load(model, layers=[1])))
    q = model.model.layers[1].self_attn.q_proj.weight
    assert layer.W_Q.untyped_storage().data_ptr() == q.untyped_storage().data_ptr()
    assert torch.equal(layer.W_Q[0], q[:16].T)  # head 0 = the first d_head rows, transposed


def test_name_from_config_and_pair_dict():
    torch.manual_seed(0)
    model = _bert()
    model.config.name_or_path = "my-org/my-bert"
    assert qkinspect.analyze(model, layers=[0], metrics=["symmetry"]).model.source == "memory:my-org/my-bert"
    raw = model.config.to_dict()
    r = qkinspect.analyze((raw, model.state_dict()), layers=[0], metrics=["symmetry"])
    assert r.model.name == "my-org/my-bert" and r.model.model_type == "bert"


def test_refusals():
    from transformers import LlamaConfig, LlamaForCausalLM

    with pytest.raises(InputError, match="PreTrainedModel"):
        qkinspect.analyze(torch.nn.Linear(3, 3))
    with torch.device("meta"):
        meta = LlamaForCausalLM(LlamaConfig(**TINY))
    with pytest.raises(InputError, match="meta device"):
        qkinspect.analyze(meta)
    with pytest.raises(InputError, match="not supported"):
        qkinspect.analyze(({"model_type": "no-such-type"}, {}))
    with pytest.raises(InputError, match="not a mapping"):
        qkinspect.analyze((LlamaConfig(**TINY), [1, 2]))


def test_parametrised_weight_is_read_as_computed():
    """A weight under torch.nn.utils.parametrize (as healing keeps an edit) is read as the module computes it."""
    from torch.nn.utils import parametrize

    torch.manual_seed(0)
    model = _llama()
    k = model.model.layers[0].self_attn.k_proj

    class Double(torch.nn.Module):
        def forward(self, w):
            return 2 * w

    before = next(iter(load(model, layers=[0]))).W_K.clone()
    parametrize.register_parametrization(k, "weight", Double())
    after = next(iter(load(model, layers=[0]))).W_K
    assert torch.equal(after, 2 * before)


def test_extract_writes_the_same_tensors(tmp_path):
    from safetensors.torch import load_file

    from qkinspect.extract.run import extract_heads

    torch.manual_seed(0)
    model = _qwen3()
    model.save_pretrained(tmp_path / "saved")
    assert extract_heads(model, tmp_path / "mem.safetensors") == extract_heads(str(tmp_path / "saved"),
                                                                               tmp_path / "file.safetensors")
    a, b = load_file(tmp_path / "mem.safetensors"), load_file(tmp_path / "file.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_model_on_the_gpu_is_read_there():
    torch.manual_seed(0)
    model = _llama()
    want = qkinspect.analyze(model, metrics=["symmetry"])
    got = qkinspect.analyze(model.cuda(), metrics=["symmetry"], device="cuda")
    assert got.model.source == want.model.source
    for a, b in zip(got.heads, want.heads, strict=True):
        assert a.values["symmetry"] == pytest.approx(b.values["symmetry"], rel=1e-4, abs=1e-6)
    layer = next(iter(load(model, layers=[0])))
    assert layer.W_Q.is_cuda


def test_a_model_loaded_from_a_folder_is_named_as_that_folder_is(tmp_path):
    """from_pretrained(PATH) sets name_or_path to the whole local path: titles and tables name it as `analyze PATH`
    does (the folder's name, the demo as the demo), never the machine's path, which stays in its source."""
    from transformers import AutoModel

    from qkinspect.report.analysis.figures import figure

    torch.manual_seed(0)
    folder = tmp_path / "runs" / "my-bert"
    _bert().save_pretrained(folder)
    model = AutoModel.from_pretrained(folder)
    assert model.config.name_or_path == str(folder)
    by_path = qkinspect.analyze(str(folder), layers=[0], metrics=["symmetry"])
    in_memory = qkinspect.analyze(model, layers=[0], metrics=["symmetry"])
    assert in_memory.model.name == by_path.model.name == "my-bert"
    assert in_memory.model.source == f"memory:{folder}"
    title = figure(in_memory, "symmetry").get_suptitle()
    assert "my-bert" in title and str(tmp_path) not in title
    model.config.name_or_path = str(folder / "model")  # a generic folder is named by its parent, as by path
    (folder / "model").mkdir()
    assert qkinspect.analyze(model, layers=[0], metrics=["symmetry"]).model.name == "my-bert"


def test_the_demo_in_memory_is_named_as_the_demo():
    from transformers import AutoModel

    from qkinspect.demo import DEMO_NAME, demo_path
    from qkinspect.errors import DemoNotInstalledError

    try:
        path = demo_path()
    except DemoNotInstalledError as e:
        pytest.skip(str(e))
    model = AutoModel.from_pretrained(path)
    assert qkinspect.analyze(model, layers=[0], metrics=["symmetry"]).model.name == DEMO_NAME
