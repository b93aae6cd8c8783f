"""Quantized safetensors: a quantization_config qkinspect does not understand is refused (exit 2, one line), never
read raw."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from qkinspect.errors import CheckpointError, UnsupportedModelError
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


# -- dequantized on read ------------------------------------------------------------------------------------------

ATTN = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense")


def quantized_bert(tmp_path, qc: dict, quantize):
    """A tiny BERT whose attention Linear weights are replaced by `quantize(name, w)` -> {suffix: tensor}."""
    from safetensors.torch import save_file

    config, state = tiny.bert()
    folder = tiny.write(tmp_path / "q", config, state)
    out = {}
    for k, v in state.items():
        module = k.removesuffix(".weight")
        if k.endswith(".weight") and module.split("layer.", 1)[-1].split(".", 1)[-1] in ATTN:
            out.update({f"{module}.{s}": t for s, t in quantize(module, v).items()})
        else:
            out[k] = v
    save_file(out, str(folder / "model.safetensors"))
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "quantization_config": qc}))
    return folder, state, out


def fp8_blocks(w, bo, bi):
    """FP8 e4m3 with one scale per (bo, bi) block (partial blocks at the edges), as DeepSeek-V3 ships."""
    O, I = w.shape
    s = torch.empty(-(-O // bo), -(-I // bi))
    q = torch.empty(O, I, dtype=torch.float8_e4m3fn)
    for r in range(s.shape[0]):
        for c in range(s.shape[1]):
            blk = w[r * bo:(r + 1) * bo, c * bi:(c + 1) * bi]
            s[r, c] = blk.abs().max() / 448.0
            q[r * bo:(r + 1) * bo, c * bi:(c + 1) * bi] = (blk / s[r, c]).to(torch.float8_e4m3fn)
    return {"weight": q, "weight_scale_inv": s}


def reference_blocks(q, s, bo, bi):
    """The dequantization element by element: W[i, j] = q[i, j] * s[i // bo, j // bi]."""
    O, I = q.shape
    rows = torch.arange(O) // bo
    cols = torch.arange(I) // bi
    return q.float() * s[rows[:, None], cols[None, :]]


def layer_weights(folder):
    with open_model(folder) as m:
        return m.info, list(m.layers())


@pytest.mark.parametrize("block", [(16, 16), (24, 8)], ids=["16x16", "24x8-partial"])
def test_fp8_block_scaled_bert_is_dequantized(tmp_path, block):
    """The issue's case: an FP8 BERT with weight_scale_inv, once read raw (W_Q off by ~500), now dequantized."""
    bo, bi = block
    folder, state, stored = quantized_bert(
        tmp_path, {"quant_method": "fp8", "weight_block_size": list(block), "activation_scheme": "dynamic"},
        lambda m, w: fp8_blocks(w * 0.01, bo, bi))
    info, layers = layer_weights(folder)
    assert info.quantization == f"fp8 ({bo}x{bi} blocks)" and info.dtype == "float8_e4m3fn"
    for lay in layers:
        p = f"encoder.layer.{lay.layer}.attention.self.query"
        want = reference_blocks(stored[f"{p}.weight"], stored[f"{p}.weight_scale_inv"], bo, bi)
        assert torch.equal(lay.W_Q, want.reshape(4, 8, 32).transpose(1, 2))  # (H*d, D) -> (H, D, d)
        original = state[f"{p}.weight"] * 0.01
        rel = (want - original).norm() / original.norm()
        assert rel < 0.05  # FP8 e4m3 keeps ~3 bits of mantissa; read raw it would be off by a factor ~ 1/scale


def test_fp8_block_equals_transformers_dequantization(tmp_path):
    """The same weights as transformers' own FP8 loader with dequantize=True (its public route, not its internals)."""
    import transformers as tf

    folder, _, stored = quantized_bert(tmp_path, {"quant_method": "fp8", "weight_block_size": [16, 16]},
                                       lambda m, w: fp8_blocks(w, 16, 16))
    _, layers = layer_weights(folder)
    qc = tf.FineGrainedFP8Config(weight_block_size=(16, 16), dequantize=True)
    model = tf.AutoModel.from_pretrained(folder, quantization_config=qc, dtype=torch.float32)
    theirs = model.encoder.layer[1].attention.self.key.weight.detach()  # (H*d, D)
    assert theirs.dtype == torch.float32
    assert torch.equal(layers[1].W_K, theirs.reshape(4, 8, 32).transpose(1, 2))


@pytest.mark.parametrize("per", ["tensor", "channel"])
def test_fp8_per_tensor_and_per_channel(tmp_path, per):
    def quantize(module, w):
        s = w.abs().amax() / 448 if per == "tensor" else w.abs().amax(dim=1, keepdim=True) / 448
        return {"weight": (w / s).to(torch.float8_e4m3fn), "weight_scale_inv": s.reshape(() if per == "tensor"
                                                                                          else (-1, 1))}
    folder, _, stored = quantized_bert(tmp_path, {"quant_method": "fp8"}, quantize)
    _, layers = layer_weights(folder)
    p = "encoder.layer.0.attention.self.value"
    want = stored[f"{p}.weight"].float() * stored[f"{p}.weight_scale_inv"]
    assert torch.equal(layers[0].W_V, want.reshape(4, 8, 32).transpose(1, 2))


def test_fp8_weight_without_scale_is_refused(tmp_path):
    def quantize(module, w):
        return {"weight": w.to(torch.float8_e4m3fn)}
    folder, _, _ = quantized_bert(tmp_path, {"quant_method": "fp8", "weight_block_size": [16, 16]}, quantize)
    with pytest.raises(CheckpointError, match="has no .*weight_scale_inv"):
        layer_weights(folder)


# -- compressed-tensors (llm-compressor's formats), with the package's own compressors ------------------------------

def ct_config(fmt: str, weights: dict) -> dict:
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
            "ignore": [], "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}}


CT_CASES = {
    "int4-group-sym": ("pack-quantized", {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                                          "group_size": 16}),
    "int4-group-asym": ("pack-quantized", {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group",
                                           "group_size": 8}),
    "int8-channel": ("pack-quantized", {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}),
    "fp8-channel": ("float-quantized", {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel"}),
    "fp8-tensor": ("float-quantized", {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor"}),
}


@pytest.mark.parametrize("case", sorted(CT_CASES))
def test_compressed_tensors_dequantized_by_the_package(tmp_path, case):
    ct = pytest.importorskip("compressed_tensors", reason="compressed-tensors is not installed "
                                                          "(pip install 'qkinspect[quantized]')")
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams

    fmt, weights = CT_CASES[case]
    args = QuantizationArgs(**weights)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    compressor = BaseCompressor.get_value_from_registry(fmt)

    def quantize(module, w):
        if args.strategy == "group":
            g = w.reshape(w.shape[0], -1, args.group_size)  # (O, I) -> (O, I/g, g)
            lo, hi = g.amin(dim=-1), g.amax(dim=-1)
        elif args.strategy == "channel":
            lo, hi = w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
        else:
            lo, hi = w.amin().reshape(1), w.amax().reshape(1)
        scale, zp = calculate_qparams(lo, hi, args)
        return compressor.compress({"weight": w, "weight_scale": scale, "weight_zero_point": zp}, scheme)

    folder, state, stored = quantized_bert(tmp_path, ct_config(fmt, weights), quantize)
    info, layers = layer_weights(folder)
    assert info.quantization.startswith(f"compressed-tensors {fmt}")
    for lay in layers:
        for proj, got in (("self.query", lay.W_Q), ("self.key", lay.W_K), ("self.value", lay.W_V)):
            module = f"encoder.layer.{lay.layer}.attention.{proj}"
            local = {k.removeprefix(module + "."): v for k, v in stored.items() if k.startswith(module + ".")}
            want = compressor.decompress(local, scheme)["weight"].float()  # the package's reference
            assert torch.equal(got, want.reshape(4, 8, 32).transpose(1, 2)), (case, module)
            original = state[f"{module}.weight"]
            assert (want - original).norm() / original.norm() < 0.2  # int4 with 8-16 wide groups: a few percent
    assert ct.__name__ == "compressed_tensors"


def test_info_and_processing_record_the_dequantization(tmp_path):
    from qkinspect.cli.app import app

    folder, _, _ = quantized_bert(tmp_path, {"quant_method": "fp8", "weight_block_size": [16, 16]},
                                  lambda m, w: fp8_blocks(w, 16, 16))
    r = CliRunner().invoke(app, ["info", str(folder), "-f", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["model"]["quantization"] == "fp8 (16x16 blocks)"
    r = CliRunner().invoke(app, ["info", str(folder), "-f", "table"])
    assert "quantized: fp8 (16x16 blocks) (dequantized on read)" in r.stdout
    r = CliRunner().invoke(app, ["analyze", str(folder), "-f", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["processing"]["dequantized"] == "fp8 (16x16 blocks)"


def test_deepseek_v3_fp8_is_dequantized(tmp_path):
    """DeepSeek-V3 as released: every attention projection FP8 with 128x128 (here 16x16) block scales. The MLA
    adapter reads the dequantized weights: its layers equal those of the same model saved with those weights in
    float32 and no quantization."""
    from safetensors.torch import load_file, save_file

    from tests.adapters.test_dec_mla import build

    _, path = build("v3", tmp_path)
    state = load_file(path / "model.safetensors")
    quantized, dequantized = dict(state), dict(state)
    for k, w in state.items():
        if ".self_attn." in k and k.endswith(("proj.weight", "proj_with_mqa.weight")):
            q = fp8_blocks(w.float(), 16, 16)
            quantized[k], quantized[k + "_scale_inv"] = q["weight"], q["weight_scale_inv"]
            dequantized[k] = reference_blocks(q["weight"], q["weight_scale_inv"], 16, 16)
    ref = tmp_path / "ref"
    ref.mkdir()
    (ref / "config.json").write_text((path / "config.json").read_text())
    save_file(dequantized, str(ref / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "quantization_config": {
        "quant_method": "fp8", "weight_block_size": [16, 16], "activation_scheme": "dynamic", "fmt": "e4m3"}}))
    save_file(quantized, str(path / "model.safetensors"), metadata={"format": "pt"})
    info, got = layer_weights(path)
    _, want = layer_weights(ref)
    assert info.quantization == "fp8 (16x16 blocks)" and "float8_e4m3fn" in info.dtype
    for a, b in zip(got, want, strict=True):
        for t in ("W_Q", "W_K", "W_V", "W_O"):
            assert torch.equal(getattr(a, t), getattr(b, t)), (a.layer, t)
