"""`qkinspect composition`: every output format, the table at 80 columns, GGUF and folder input, bad input as one
line with exit 2 (nothing written), and the real SmolLM2 GGUF."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

import qkinspect
from tests.cli.schema import validate
from tests.one_line import one_error_line


def test_json_follows_the_schema_and_matches_the_library(cli, tiny_llama):
    r = cli("composition", tiny_llama, "-f", "json")
    assert r.exit_code == 0, r.stderr
    doc = validate(json.loads(r.stdout))
    assert doc["kind"] == "composition" and doc["processing"]["fold_ln"] is True
    lib = qkinspect.composition(str(tiny_llama))
    assert len(doc["records"]) == 3 * 4 * 4  # one later layer of two: 16 head pairs per kind
    for row, want in zip(doc["records"], lib.rows(), strict=True):
        assert row == pytest.approx(want)
    assert "input-norm gain folded" in r.stderr and "rotary" in r.stderr


def test_csv_ndjson_and_parquet_rows_agree(cli, tiny_llama, tmp_path):
    r = cli("composition", tiny_llama, "--kinds", "k,v", "-f", "csv")
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    nd = [json.loads(line) for line in cli("composition", tiny_llama, "--kinds", "k,v", "-f", "ndjson").stdout
          .splitlines()]
    assert len(rows) == len(nd) == 2 * 16 and {x["kind"] for x in nd} == {"k", "v"}
    assert [float(x["score"]) for x in rows] == pytest.approx([x["score"] for x in nd])
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    out = tmp_path / "c.parquet"
    assert cli("composition", tiny_llama, "--kinds", "k,v", "-o", out).exit_code == 0
    df = pd.read_parquet(out)
    assert list(df.columns) == list(nd[0]) and np.allclose(df["score"], [x["score"] for x in nd])


@pytest.fixture(scope="module")
def gains_llama(tmp_path_factory):
    """A Llama whose norm gains are not all ones (a fold changes the scores)."""
    from tests.experiment import tiny_models

    return tiny_models.llama(tmp_path_factory.mktemp("gains_llama"))


def test_no_fold_ln_changes_the_scores_and_says_so(cli, gains_llama):
    a = json.loads(cli("composition", gains_llama, "-f", "json").stdout)
    r = cli("composition", gains_llama, "--no-fold-ln", "-f", "json")
    b = json.loads(r.stdout)
    assert b["processing"]["fold_ln"] is False and "as stored" in r.stderr
    assert any(abs(x["score"] - y["score"]) > 1e-3 for x, y in zip(a["records"], b["records"], strict=True))
    c = json.loads(cli("composition", gains_llama, "--fold-ln", "-f", "json").stdout)
    assert c["records"] == a["records"]


def test_table_fits_80_columns(cli, tiny_bert):
    r = cli("composition", tiny_bert, "--top", "3", "-f", "table", env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert sum(line.startswith("L0 H") for line in lines) == 9  # three per kind, all from layer 0 into layer 1
    assert "Q-composition" in r.stdout and "null = 1/√d_model" in r.stdout


def test_a_gguf_file(cli, tmp_path):
    from tests.experiment.tiny_gguf import llama_gguf

    path = llama_gguf(tmp_path / "tiny.gguf")
    r = cli("composition", path, "-f", "json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["model"]["format"] == "gguf" and len(doc["records"]) == 3 * 16
    assert all(0 <= x["score"] <= 1 for x in doc["records"])


@pytest.mark.parametrize("args,says", [
    (["--kinds", "x"], "--kinds x"),
    (["--top", "0"], "--top"),
    (["--to-layers", "7"], "--to-layers: 7 is out of range"),
    (["--from-heads", "9"], "--from-heads: 9 is out of range"),
    (["--layers", "1"], "no earlier head composes"),
    (["--format", "parquet"], "give -o FILE.parquet"),
    (["-o", "x.xlsx"], "cannot tell the format"),
    (["--block", "cross"], "--block cross"),
])
def test_bad_input_is_one_line(cli, tiny_llama, args, says, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_error_line(cli("composition", tiny_llama, *args), says)
    assert not list(tmp_path.iterdir())  # nothing written


def test_a_missing_model_is_one_line(cli, tmp_path):
    one_error_line(cli("composition", tmp_path / "nope"), "nope")


@pytest.mark.slow
def test_smollm2_gguf_float32_within_1e_4_of_float64():
    """The real SmolLM2-135M GGUF (30 layers x 9 heads, 3 KV heads): every float32 score within 1e-4 (relative)
    of float64, and the scores' mean square near the null's 1/D (trained heads compose more than chance)."""
    from tests.loading.test_real_weights import SMOLLM2, package_file

    path = package_file(*SMOLLM2)
    a = qkinspect.composition(path, to_layers="0-9")
    b = qkinspect.composition(path, to_layers="0-9", precision="float64")
    worst = max(float(np.nanmax(np.abs(a.scores[k] - b.scores[k]) / np.abs(b.scores[k]))) for k in a.scores)
    assert worst < 1e-4
    assert len(a.scores) == 3 * 45 and all(np.isfinite(s).all() for s in a.scores.values())
    ms = np.mean([np.mean(s**2) for s in a.scores.values()]) * 576
    assert 1 < ms < 10, ms


def test_a_quantized_checkpoint_is_scored_on_its_dequantized_weights(tmp_path):
    """FP8 block-scaled BERT: the same scores as the same BERT written with the dequantized weights in float32."""
    from tests.loading import tiny
    from tests.loading.test_quantized import ATTN, fp8_blocks, quantized_bert, reference_blocks

    folder, state, stored = quantized_bert(
        tmp_path, {"quant_method": "fp8", "weight_block_size": [16, 16], "activation_scheme": "dynamic"},
        lambda m, w: fp8_blocks(w * 0.01, 16, 16))
    plain = dict(state)
    for k in state:
        module = k.removesuffix(".weight")
        if k.endswith(".weight") and module.split("layer.", 1)[-1].split(".", 1)[-1] in ATTN:
            plain[k] = reference_blocks(stored[k], stored[f"{module}.weight_scale_inv"], 16, 16)
    config, _ = tiny.bert()
    other = tiny.write(tmp_path / "plain", config, plain)
    a, b = qkinspect.composition(str(folder)), qkinspect.composition(str(other))
    assert a.processing.dequantized and a.scores.keys() == b.scores.keys()
    for k in a.scores:
        np.testing.assert_allclose(a.scores[k], b.scores[k], rtol=1e-6)
