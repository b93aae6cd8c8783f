"""Fuzzing quantization configs (issue 25): the quantization_config of a tiny FP8 block-quantized BERT and of a
compressed-tensors one is mutated (hypothesis), and every `analyze` must end in exit 0 with a valid document or
exit 2 with exactly one `error:` line, nothing written, within 60 s (the checks of test_fuzz_hostile.check_run).
Derandomized and few by default; a longer hunt: QKINSPECT_FUZZ_EXAMPLES=500 python -m pytest <this file>."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.loading.test_fuzz_hostile import FUZZ, check_run, json_values
from tests.loading.test_quantized import ct_config, fp8_blocks, quantized_bert

FP8 = {"quant_method": "fp8", "weight_block_size": [16, 16], "activation_scheme": "dynamic"}
CT = ct_config("pack-quantized", {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                                  "group_size": 16})


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz_quantized")
    quantized_bert(root / "fp8", FP8, lambda m, w: fp8_blocks(w, 16, 16))
    quantized_bert(root / "ct", CT, lambda m, w: {"weight": w})
    return root


ints = st.integers(-2, 40) | st.sampled_from([0, 1, 16, 2**31, 2**63])
block_sizes = st.lists(ints | st.floats(0, 64) | st.booleans(), max_size=4) | json_values
targets = st.lists(st.sampled_from(["Linear", "re:.*query", "re:((", "re:[z-a]", "re:(a+)+$", "query", "", "re:"])
                   | json_values, max_size=3) | json_values
groups = st.dictionaries(st.text(max_size=4), st.fixed_dictionaries(
    {}, optional={"targets": targets, "weights": json_values | st.fixed_dictionaries(
        {}, optional={"num_bits": ints, "type": st.sampled_from(["int", "float", "x"]) | json_values,
                      "strategy": st.sampled_from(["group", "channel", "tensor", "block"]) | json_values,
                      "group_size": ints | json_values, "symmetric": st.booleans() | json_values}),
                  "format": st.sampled_from(["pack-quantized", "naive-quantized", "x"]) | json_values})
    | json_values, max_size=2) | json_values
FP8_KEYS = {"weight_block_size": block_sizes, "activation_scheme": json_values, "quant_method": json_values,
            "modules_to_not_convert": targets}
CT_KEYS = {"config_groups": groups, "ignore": targets, "format": st.sampled_from(["pack-quantized", "x"]) | json_values,
           "quant_method": json_values, "quantization_status": json_values}


@st.composite
def qc_edits(draw, keys: dict):
    names = draw(st.lists(st.sampled_from(sorted(keys)), min_size=1, max_size=3, unique=True))
    return [(k, draw(keys[k] | st.just("<delete>"))) for k in names]


def run_with(base: Path, which: str, edits, to_file: bool, whole=None) -> None:
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        folder = shutil.copytree(base / which / "q", work / "q")
        cfg = json.loads((folder / "config.json").read_text())
        qc = cfg["quantization_config"]
        for key, value in edits:
            if value == "<delete>":
                qc.pop(key, None)
            else:
                qc[key] = value
        if whole is not None:
            cfg["quantization_config"] = whole
        (folder / "config.json").write_text(json.dumps(cfg, allow_nan=True))
        check_run(folder, work, to_file)


@FUZZ
@given(edits=qc_edits(FP8_KEYS), to_file=st.booleans())
def test_fuzz_fp8_config(base, edits, to_file):
    run_with(base, "fp8", edits, to_file)


@FUZZ
@given(edits=qc_edits(CT_KEYS), to_file=st.booleans())
def test_fuzz_compressed_tensors_config(base, edits, to_file):
    """The config is checked before the compressed-tensors package is needed: without it, a valid config is
    refused in one line too."""
    run_with(base, "ct", edits, to_file)


@FUZZ
@given(whole=json_values, to_file=st.booleans())
def test_fuzz_whole_quantization_config(base, whole, to_file):
    run_with(base, "fp8", [], to_file, whole=whole)
