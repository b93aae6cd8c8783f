"""Hostile quantization configs (issue 25 class 8): a value qkinspect reads that is not what it must be is one
`error:` line naming config.json and the key, exit 2; an FP8 bias with its scale is dequantized like a weight."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from qkinspect.cli.app import app
from tests.loading.test_quantized import ct_config, fp8_blocks, quantized_bert
from tests.one_line import one_error_line


def analyze(folder):
    return CliRunner().invoke(app, ["analyze", str(folder), "--metrics", "symmetry", "--format", "json"])


FP8_BLOCKS = [[0, 0], [16, 16, 16], "ab", [16.5, 16], {}, [16], [True, 16], [-16, 16], [2**40, 16], 16]


@pytest.mark.parametrize("block", FP8_BLOCKS, ids=map(repr, FP8_BLOCKS))
def test_fp8_weight_block_size_is_checked(tmp_path, block):
    folder, _, _ = quantized_bert(tmp_path, {"quant_method": "fp8", "weight_block_size": block},
                                  lambda m, w: fp8_blocks(w, 16, 16))
    for cmd in (["info"], ["analyze"]):
        r = CliRunner().invoke(app, [*cmd, str(folder)])
        one_error_line(r, str(folder / "config.json"), "quantization_config.weight_block_size")


CT_BAD = {
    "config_groups a list": ({"config_groups": [{"targets": ["Linear"]}]}, "config_groups"),
    "config_groups a string": ({"config_groups": "group_0"}, "config_groups"),
    "a group a list": ({"config_groups": {"g": ["Linear"]}}, "config_groups.g"),
    "weights a list": ({"config_groups": {"g": {"targets": ["Linear"], "weights": [4]}}}, "config_groups.g.weights"),
    "ignore a number": ({"ignore": 5}, "quantization_config.ignore"),
    "ignore of numbers": ({"ignore": [5]}, "quantization_config.ignore"),
    "targets a string": ({"config_groups": {"g": {"targets": "Linear"}}}, "config_groups.g.targets"),
    "a target regex that does not compile": ({"config_groups": {"g": {"targets": ["re:(("]}}},
                                              "not a regular expression"),
    "an ignore regex that does not compile": ({"ignore": ["re:[z-a]"]}, "not a regular expression"),
    "format a number": ({"format": 4}, "quantization_config.format"),
}


@pytest.mark.parametrize("case", list(CT_BAD))
def test_compressed_tensors_config_is_checked(tmp_path, case):
    change, says = CT_BAD[case]
    qc = {**ct_config("pack-quantized", {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                                         "group_size": 16}), **change}
    folder, _, _ = quantized_bert(tmp_path, qc, lambda m, w: {"weight": w})
    one_error_line(analyze(folder), str(folder / "config.json"), says)


def test_fp8_bias_with_its_scale_is_dequantized(tmp_path):
    """A 1-D FP8 tensor (a bias) with a scale beside it: dequantized per element or per tensor, like a weight."""
    from safetensors.torch import load_file, save_file

    folder, state, _ = quantized_bert(tmp_path, {"quant_method": "fp8"}, lambda m, w: fp8_blocks(w, 16, 16))
    stored = load_file(folder / "model.safetensors")
    name = "encoder.layer.0.attention.self.query.bias"
    b = state[name] + 0.5
    scale = b.abs().max() / 448
    stored[name] = (b / scale).to(torch.float8_e4m3fn)
    stored[name + "_scale_inv"] = scale.reshape(1)
    save_file(stored, str(folder / "model.safetensors"))
    from qkinspect.loading import open_model

    with open_model(folder) as m:
        layer = m.layer("encoder", 0)
    want = stored[name].float() * scale
    assert torch.equal(layer.b_Q.reshape(-1), want)
    stored[name + "_scale_inv"] = torch.ones(3)  # a scale that fits neither the bias nor the tensor
    save_file(stored, str(folder / "model.safetensors"))
    one_error_line(analyze(folder), "scale of shape (3,) for a bias of shape (32,)", name)
