"""`qkinspect compare`: per-head differences B − A, and a clear refusal when the architectures differ."""

from __future__ import annotations

import csv
import io
import json

import pytest

import qkinspect
from tests.cli.schema import validate


def test_json_differences_match_two_analyses(cli, tiny_bert, tiny_bert_b):
    r = cli("compare", tiny_bert, tiny_bert_b, "-f", "json", "--metrics", "symmetry,overlap_qk")
    assert r.exit_code == 0, r.stderr
    d = validate(json.loads(r.stdout))
    assert d["kind"] == "compare" and d["metrics"] == ["symmetry", "overlap_qk"]
    a = {(h.layer, h.head): h.values for h in qkinspect.analyze(str(tiny_bert), metrics=["symmetry"]).heads}
    b = {(h.layer, h.head): h.values for h in qkinspect.analyze(str(tiny_bert_b), metrics=["symmetry"]).heads}
    assert len(d["heads"]) == 8
    for row in d["heads"]:
        key = (row["layer"], row["head"])
        assert row["symmetry_a"] == pytest.approx(a[key]["symmetry"])
        assert row["delta_symmetry"] == pytest.approx(b[key]["symmetry"] - a[key]["symmetry"])
    assert any(abs(row["delta_symmetry"]) > 1e-3 for row in d["heads"])  # two different random models


def test_same_model_has_zero_differences(cli, tiny_bert):
    rows = list(csv.DictReader(io.StringIO(cli("compare", tiny_bert, tiny_bert, "-f", "csv").stdout)))
    assert len(rows) == 8 and "delta_overlap_kv" in rows[0]
    assert all(float(v) == 0.0 for row in rows for k, v in row.items() if k.startswith("delta_") and v)


def test_table(cli, tiny_bert, tiny_bert_b):
    r = cli("compare", tiny_bert, tiny_bert_b, "--layers", "0", "-f", "table", "--metrics", "symmetry")
    assert r.exit_code == 0, r.stderr
    assert "per-head differences, B − A" in r.stdout and "delta_symmetry: mean |Δ|" in r.stdout


def test_different_shapes_refused(cli, tiny_bert, tiny_bert_wide, tmp_path):
    r = cli("compare", tiny_bert, tiny_bert_wide, "-o", tmp_path / "d.json")
    assert r.exit_code == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "shapes differ" in lines[0] and "n_heads 4 vs 8" in lines[0]
    assert not (tmp_path / "d.json").exists()


def test_ndjson(cli, tiny_bert, tiny_bert_b):
    r = cli("compare", tiny_bert, tiny_bert_b, "-f", "ndjson", "--heads", "0")
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(x["layer"], x["head"]) for x in rows] == [(0, 0), (1, 0)]
