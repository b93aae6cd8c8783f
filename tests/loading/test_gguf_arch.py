"""Every GGUF architecture qkinspect reads, proven on a tiny model converted as llama.cpp converts it: the layers
read from the GGUF file equal those read from the same model saved by save_pretrained (whose adapter is proven
against the model's own forward pass in tests/adapters), and the tensors equal those of transformers' own GGUF
loader where it supports the architecture."""

from __future__ import annotations

import pytest
import torch

from qkinspect.loading import open_model
from qkinspect.loading.gguf_arch import ARCHES
from tests.loading.gguf_convert import CASES, NOT_IN_TRANSFORMERS_GGUF, gguf_arch, tiny_model, write_gguf

YARN_CASES = {c for c, (_, kw, _) in CASES.items() if kw.get("rope_parameters", {}).get("rope_type") == "yarn"}

TENSORS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O", "q_norm", "k_norm")


@pytest.fixture(scope="module", params=sorted(CASES))
def converted(request, tmp_path_factory):
    case = request.param
    tmp = tmp_path_factory.mktemp(case)
    config, model = tiny_model(case)
    model.save_pretrained(tmp / "hf")
    return case, model, tmp / "hf", write_gguf(tmp / "m.gguf", case, config, model)


def _layers(spec):
    with open_model(spec) as m:
        return m.info, list(m.layers())


def _close(a, b, what):
    assert (a is None) == (b is None), what
    if a is not None:
        assert a.shape == b.shape, what
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6, msg=what)


def test_gguf_layers_equal_the_safetensors_layers(converted):
    case, _, folder, path = converted
    info_hf, hf = _layers(folder)
    info_gg, gg = _layers(path)
    assert info_gg.model_type == ARCHES[gguf_arch(case)].model_type  # deepseek2 is read as deepseek_v2 ...
    assert info_hf.model_type == CASES[case][0]  # ... whatever family wrote it (V3: same attention, same RoPE)
    assert info_gg.blocks == info_hf.blocks  # heads, widths, RoPE dims, scale, q/k-norm ...
    assert len(gg) == len(hf) > 0
    for a, b in zip(gg, hf, strict=True):
        for t in TENSORS:
            _close(getattr(a, t), getattr(b, t), f"{case} layer {a.layer} {t}")
        for norm in ("norm_q", "norm_kv"):
            na, nb = getattr(a, norm), getattr(b, norm)
            assert (na is None) == (nb is None)
            if na is not None:
                assert na.kind == nb.kind and na.add_unit_offset == nb.add_unit_offset
                _close(na.weight, nb.weight, f"{case} layer {a.layer} {norm}")
                _close(na.bias, nb.bias, f"{case} layer {a.layer} {norm} bias")


def test_gguf_tensors_equal_transformers_gguf_loader(converted):
    case, model, _, path = converted
    if case in NOT_IN_TRANSFORMERS_GGUF:
        pytest.skip(f"transformers' GGUF loader does not support {gguf_arch(case)!r}")
    if case == "falcon":
        pytest.skip("transformers' GGUF loader does not undo the converter's QKV re-ordering for Falcon's new "
                    "architecture (it reads the sections as grouped); proven against safetensors above")
    from transformers import AutoModelForCausalLM

    # Its config reader takes some sizes from elsewhere (vocabulary, GPT-2's n_inner): non-attention tensors of the
    # tiny model may not fit and are re-initialised; an attention tensor that did not fit would fail below.
    theirs = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                  ignore_mismatched_sizes=True).state_dict()
    with open_model(path) as m:
        names = [n for i in range(m.info.blocks[0].n_layers)
                 for n in m.adapter.tensor_names("decoder", i) + m.adapter.optional_names("decoder", i)]
        checked = 0
        for name in names:
            ours = m.source.get(name)
            if ours is None:
                continue
            key = next(k for k in theirs if k.endswith(name))
            _close(ours, theirs[key].float(), f"{case} {name}")
            checked += 1
    assert checked >= 4 * m.info.blocks[0].n_layers // 2


def test_gguf_config_needs_no_transformers(converted):
    """The config built from GGUF metadata is answered by the light config reader: transformers' config class is
    never built (opening a GGUF file costs no transformers import)."""
    case, _, _, path = converted
    with open_model(path) as m:  # the adapter reads every value it needs, for every layer
        next(m.layers())
        config = m.resolved.config
    if case in YARN_CASES:  # YaRN is left to transformers' config class, as from a config.json (docs/loading.md)
        assert config.deferred == {"rope_parameters"}, (case, config.deferred)
        return
    assert not config.used_transformers and not config.deferred, (case, config.deferred)
