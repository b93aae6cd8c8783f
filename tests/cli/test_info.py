"""`qkinspect info` in every format."""

from __future__ import annotations

import csv
import io
import json


def test_info_json_tiny_bert(cli, tiny_bert):
    r = cli("info", tiny_bert, "--format", "json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["schema"], d["kind"]) == ("qkinspect/1", "info")
    m = d["model"]
    assert m["model_type"] == "bert" and m["format"] == "safetensors" and m["dtype"] == "float32"
    (b,) = m["blocks"]
    assert (b["name"], b["n_layers"], b["n_heads"], b["n_kv_heads"], b["d_model"], b["d_head"]) == \
        ("encoder", 2, 4, 4, 32, 8)
    # q, k, v, o weights (32x32) per layer, float32, two layers (biases are not counted by the loader)
    assert 2 * 4 * 32 * 32 * 4 <= m["attention_bytes"] <= 2 * (4 * 32 * 32 + 4 * 32) * 4


def test_human_bytes():
    from qkinspect.terminal.info import human_bytes

    assert [human_bytes(n) for n in (0, 1023, 1536, 3 * 2**20, 5 * 2**40)] == \
        ["0 B", "1023 B", "1.5 KiB", "3.0 MiB", "5120.0 GiB"]


def test_info_pipe_defaults_to_json(cli, tiny_bert):
    r = cli("info", tiny_bert)
    assert json.loads(r.stdout)["kind"] == "info"


def test_info_csv_and_ndjson_rows(cli, tiny_bert):
    rows = list(csv.DictReader(io.StringIO(cli("info", tiny_bert, "-f", "csv").stdout)))
    assert len(rows) == 1
    assert rows[0]["block"] == "encoder" and rows[0]["n_heads"] == "4" and rows[0]["positional"] == "absolute"
    lines = cli("info", tiny_bert, "-f", "ndjson").stdout.splitlines()
    assert [json.loads(x)["d_head"] for x in lines] == [8]


def test_info_table(cli, tiny_bert):
    from qkinspect.terminal.info import human_bytes

    nbytes = json.loads(cli("info", tiny_bert, "-f", "json").stdout)["model"]["attention_bytes"]
    r = cli("info", tiny_bert, "--format", "table")
    assert r.exit_code == 0
    for word in ("bert", "encoder", "KV heads", "d_model", "absolute", f"attention weights: {human_bytes(nbytes)}"):
        assert word in r.stdout
    assert r.stderr == ""


def test_info_demo_to_file(cli, tmp_path):
    out = tmp_path / "info.json"
    r = cli("info", "-o", out)
    assert r.exit_code == 0 and r.stdout == ""
    assert "demo model" in r.stderr and "wrote json" in r.stderr
    b = json.loads(out.read_text())["model"]["blocks"][0]
    assert (b["n_layers"], b["n_heads"], b["d_model"], b["d_head"]) == (6, 12, 384, 32)
