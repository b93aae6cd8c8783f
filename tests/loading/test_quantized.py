"""Quantized safetensors: a quantization_config qkinspect does not understand is refused (exit 2, one line), never
read raw."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from qkinspect.errors import UnsupportedModelError
from qkinspect.loading import open_model
from tests.loading import tiny


def bert_with_config(tmp_path, **extra):
    config, state = tiny.bert()
    folder = tiny.write(tmp_path / "m", config, state)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **extra}))
    return folder


@pytest.mark.parametrize("extra", [
    {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}},
    {"quantization_config": {"quant_method": "awq", "bits": 4}},
    {"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}},
    {"quantization_config": {"quant_method": "no-such-method"}},
    {"quantization_config": {"bits": 4}},  # no quant_method at all
    {"quantization_config": "fp8"},  # not even a dict
    {"compression_config": {"quant_method": "compressed-tensors"}},  # the legacy key
    {"text_config": {"quantization_config": {"quant_method": "gptq"}}},  # inside a sub-config
], ids=["gptq", "awq", "bnb", "unknown", "no-method", "not-a-dict", "compression_config", "nested"])
def test_unknown_quantization_is_refused(tmp_path, extra):
    folder = bert_with_config(tmp_path, **extra)
    with pytest.raises(UnsupportedModelError, match="cannot dequantize") as e:
        open_model(folder)
    assert e.value.exit_code == 2 and "\n" not in str(e.value)
    assert "config.json" in str(e.value)


def test_unknown_quantization_cli_one_line_exit_2(tmp_path):
    from qkinspect.cli.app import app

    folder = bert_with_config(tmp_path, quantization_config={"quant_method": "gptq", "bits": 4})
    for cmd in (["info"], ["extract", "--layers", "0", "-o", str(tmp_path / "x.safetensors")]):
        r = CliRunner().invoke(app, [*cmd, str(folder)])
        assert r.exit_code == 2, r.output
        assert r.stdout == ""
        assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("error: ")
        assert "gptq" in r.stderr


def test_unquantized_config_still_opens(tmp_path):
    folder = bert_with_config(tmp_path, quantization_config=None)  # transformers writes null for "none"
    with open_model(folder) as m:
        assert next(m.layers()).W_Q.shape == (4, 32, 8)
