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
    from qkinspect.experiment.hf import written
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
