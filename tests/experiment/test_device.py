"""`device=` / `--device` for experiments: cpu explicitly is the default run; cuda moves the model and its inputs
to the GPU and measures what the CPU measures (run where CUDA exists, skipped otherwise); a device that is not
there is refused in one line."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from qkinspect.cli.app import app
from qkinspect.errors import InputError
from qkinspect.experiment import run_experiment
from tests.experiment import tiny_models as tiny

KW = dict(layers=[1], heads=[0, 2], tokens=96, window=32)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is False)")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("device_models")
    return {"llama": tiny.llama(root / "llama"), "gpt2": tiny.gpt2(root / "gpt2"), "bert": tiny.bert(root / "bert"),
            "olmo2": tiny.olmo2(root / "olmo2"), "phi3": tiny.phi3(root / "phi3")}


def test_cpu_named_is_the_default(models):
    a = run_experiment(models["llama"], "share_qk", **KW)
    b = run_experiment(models["llama"], "share_qk", device="cpu", **KW)
    assert a.baseline == b.baseline
    assert [r.dloss for r in a.runs] == [r.dloss for r in b.runs]


def test_a_device_that_is_not_there_is_refused(models, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(InputError, match="no CUDA device"):
        run_experiment(models["llama"], "share_qk", device="cuda", **KW)
    with pytest.raises(InputError, match="not a torch device"):
        run_experiment(models["llama"], "share_qk", device="gpu0", **KW)
    r = CliRunner().invoke(app, ["experiment", str(models["llama"]), "--device", "cuda", "--tokens", "96"])
    assert r.exit_code == 2 and "no CUDA device" in r.output and "Traceback" not in r.output


def test_cli_device_cpu(models):
    r = CliRunner().invoke(app, ["experiment", str(models["gpt2"]), "--device", "cpu", "--layers", "1", "--heads",
                                 "0", "--tokens", "64", "--window", "32", "-f", "json"])
    assert r.exit_code == 0, r.output
    assert '"edit": "share_qk"' in r.stdout


@cuda
@pytest.mark.parametrize("family,edit", [("llama", "share_qk,rank:8"), ("gpt2", "share_qk"), ("bert", "symmetric"),
                                         ("olmo2", "tie_q"), ("phi3", "share_qk")])
def test_cuda_measures_what_the_cpu_measures(models, family, edit):
    from qkinspect.experiment.model.writeback import written
    from qkinspect.experiment.run import open_experiment

    _, layers, hf = open_experiment(models[family], None, [1], None, None, device="cuda")
    assert all(p.is_cuda for p in hf.model.parameters())
    with written(hf, [layers[1]]):
        assert all(p.is_cuda for p in hf.model.parameters())  # written-back modules sit on the model's device
    on_cpu = run_experiment(models[family], edit, **KW)
    on_gpu = run_experiment(models[family], edit, device="cuda", **KW)
    assert on_gpu.baseline == pytest.approx(on_cpu.baseline, rel=1e-5, abs=1e-6)
    for a, b in zip(on_cpu.runs, on_gpu.runs, strict=True):
        assert (a.edit, a.layer, a.head) == (b.edit, b.layer, b.head)
        assert b.dloss == pytest.approx(a.dloss, rel=1e-3, abs=1e-5)


def test_a_model_in_memory_runs_where_it_is(models, monkeypatch):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(models["llama"], dtype=torch.float32)
    r = run_experiment(model, "share_qk", tokenizer=models["llama"], device="cpu", **KW)
    assert r.runs and r.measure == "causal"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # past the device check: the model is on the CPU
    with pytest.raises(InputError, match="runs where it is"):
        run_experiment(model, "share_qk", tokenizer=models["llama"], device="cuda", **KW)
    assert all(p.device.type == "cpu" for p in model.parameters())


@cuda
def test_cuda_estimates_what_the_cpu_estimates(models):
    """The estimate (qkinspect.experiment.estimate) through the model on the GPU: its hooks' tensors meet the
    edited output projections there; the first-order term as on the CPU, the curvature from the same sampled
    labels (drawn on the CPU from the same seed; a label at a rounding boundary may differ, hence 5 %)."""
    from qkinspect.experiment import parse_edit
    from qkinspect.experiment.estimate import estimate_heads
    from qkinspect.experiment.model.scoring import Scorer, default_text, windows
    from qkinspect.experiment.run import open_experiment

    found = {}
    for device in ("cpu", "cuda"):
        _, originals, hf = open_experiment(models["llama"], None, [1], None, None, device=device)
        s = Scorer(hf, windows(hf, default_text(), 96, 32), batch_tokens=64)
        s.baseline(cache={1})
        found[device] = estimate_heads(s, originals, [0, 1, 2], [parse_edit("share_qk"), parse_edit("ablate")],
                                       probes=4)
    for a, b in zip(found["cpu"], found["cuda"], strict=True):
        assert (a.layer, a.head, a.edit) == (b.layer, b.head, b.edit)
        assert b.first == pytest.approx(a.first, rel=1e-3, abs=1e-6)
        assert b.curvature == pytest.approx(a.curvature, rel=0.05, abs=1e-6)
