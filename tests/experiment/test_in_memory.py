"""run_experiment on a model in memory: the same runs as on the saved model, and the model left exactly as it was."""

from __future__ import annotations

import pytest
import torch

from qkinspect.errors import InputError
from qkinspect.experiment.run import run_experiment
from tests.experiment import tiny_models

TEXT = "the quick brown fox jumps over the lazy dog; " * 40


@pytest.mark.parametrize("family", ["llama", "gpt2", "bert"])
def test_in_memory_experiment_equals_saved_and_restores(family, tmp_path):
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

    folder = getattr(tiny_models, family)(tmp_path / family)
    (tmp_path / "text.txt").write_text(TEXT)
    auto = AutoModelForMaskedLM if family == "bert" else AutoModelForCausalLM
    model = auto.from_pretrained(folder)
    model.train()  # a model in the middle of training: the experiment must hand it back in train mode
    tok = AutoTokenizer.from_pretrained(folder)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = {k: id(p) for k, p in model.named_parameters()}
    kw = dict(edits="share_qk,rank:2", layers=[1], tokens=120, window=30, text=tmp_path / "text.txt")
    got = run_experiment(model, tokenizer=tok, **kw)
    want = run_experiment(str(folder), **kw)
    assert got.model.source.startswith("memory:") and got.model.format == "memory"
    assert got.baseline == pytest.approx(want.baseline, rel=1e-6)
    assert [(r.edit, r.head) for r in got.runs] == [(r.edit, r.head) for r in want.runs]
    for a, b in zip(got.runs, want.runs, strict=True):
        assert a.loss == pytest.approx(b.loss, rel=1e-5)
    after = model.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[k], v) and after[k].dtype == v.dtype for k, v in before.items())
    assert {k: id(p) for k, p in model.named_parameters()} == params
    assert all(m.training for m in model.modules())


def test_pair_and_tokenizer_needed(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tiny_models.llama(tmp_path / "llama")
    model = AutoModelForCausalLM.from_pretrained(folder)
    (tmp_path / "text.txt").write_text(TEXT)
    kw = dict(edits="share_qk", layers=[0], heads=[0], tokens=60, window=30, text=tmp_path / "text.txt")
    state = model.state_dict()
    r = run_experiment((model.config, state), tokenizer=AutoTokenizer.from_pretrained(folder), **kw)
    ref = run_experiment(str(folder), **kw)
    assert r.runs[0].loss == pytest.approx(ref.runs[0].loss, rel=1e-5)
    model.config.name_or_path = ""
    with pytest.raises(InputError, match="tokenizer="):
        run_experiment(model, **kw)
