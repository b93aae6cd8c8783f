"""`qkinspect analyze` in every format, with the selection, sorting and error options."""

from __future__ import annotations

import csv
import io
import json

import pytest

import qkinspect
from tests.cli.schema import validate


def _json(r):
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def test_json_matches_the_library_and_schema(cli, tiny_bert):
    d = validate(_json(cli("analyze", tiny_bert, "--format", "json")))
    lib = qkinspect.analyze(str(tiny_bert)).document()
    assert (d["schema"], d["kind"]) == ("qkinspect/1", "analyze")
    assert d["heads"] == lib["heads"] and d["layers"] == lib["layers"] and d["baselines"] == lib["baselines"]
    assert [(h["layer"], h["head"]) for h in d["heads"]] == [(i, h) for i in range(2) for h in range(4)]
    assert "symmetry" in d["definitions"] and d["processing"]["precision"] == "float32"


def test_pipe_defaults_to_json(cli, tiny_bert):
    assert _json(cli("analyze", tiny_bert, "--layers", "1"))["kind"] == "analyze"


def test_csv_tidy_row_per_head(cli, tiny_bert):
    r = cli("analyze", tiny_bert, "-f", "csv", "--metrics", "symmetry,overlap_qk", "--heads", "1-2")
    assert r.exit_code == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert list(rows[0]) == ["model", "block", "layer", "head", "kv_head", "rank_q", "rank_k", "rank_v", "symmetry",
                             "overlap_qk"]
    assert [(x["layer"], x["head"]) for x in rows] == [("0", "1"), ("0", "2"), ("1", "1"), ("1", "2")]
    lib = {(h.layer, h.head): h.values["symmetry"] for h in qkinspect.analyze(str(tiny_bert)).heads}
    assert all(float(x["symmetry"]) == pytest.approx(lib[(int(x["layer"]), int(x["head"]))]) for x in rows)


def test_ndjson_by_layer_with_layer_form(cli, tiny_bert):
    r = cli("analyze", tiny_bert, "-f", "ndjson", "--by", "layer", "--layer-form")
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["layer"] for x in rows] == [0, 1]
    assert all(-1 <= x["symmetry_layer"] <= 1 and "symmetry_median" in x for x in rows)


def test_sort_and_top(cli, tiny_bert):
    d = _json(cli("analyze", tiny_bert, "-f", "json", "--sort", "symmetry", "--top", "3"))
    sym = [h["symmetry"] for h in d["heads"]]
    assert len(sym) == 3 and sym == sorted(sym, reverse=True)
    everything = _json(cli("analyze", tiny_bert, "-f", "json"))["heads"]
    assert sym[0] == max(h["symmetry"] for h in everything)
    d = _json(cli("analyze", tiny_bert, "-f", "json", "--sort", "symmetry", "--ascending", "--top", "1"))
    assert d["heads"][0]["symmetry"] == min(h["symmetry"] for h in everything)


def test_table_for_people(cli):
    r = cli("analyze", "--layers", "0", "--heads", "0-2", "--format", "table")  # the demo model
    assert r.exit_code == 0, r.stderr
    out = r.stdout
    for s in ("all-MiniLM-L6-v2 (bert)", "symmetry", "overlap_qk", "per layer", "random baseline (encoder, "):
        assert s in out, s
    rows = [line.split() for line in out.splitlines() if line.startswith("    0 ")]
    assert [r[0] for r in rows] == ["0", "0", "0", "0"]  # three head rows and one layer row; one block: no column
    assert "demo model" in r.stderr and "symmetry" not in r.stderr


def test_options_reach_the_library(cli, tiny_bert):
    d = _json(cli("analyze", tiny_bert, "-f", "json", "--fold-ln", "--precision", "float64", "--block", "encoder",
                  "--layers", "1", "--metrics", "symmetry"))
    p = d["processing"]
    assert (p["fold_ln"], p["precision"], p["layers"]) == (True, "float64", [1])
    assert {k for h in d["heads"] for k in h} == {"block", "layer", "head", "kv_head", "rank_q", "rank_k", "rank_v",
                                                  "symmetry"}
    lib = qkinspect.analyze(str(tiny_bert), layers=[1], metrics=["symmetry"], fold_ln=True, precision="float64")
    assert [h["symmetry"] for h in d["heads"]] == pytest.approx([h.values["symmetry"] for h in lib.heads])


@pytest.mark.parametrize("ext, check", [
    ("json", lambda text: json.loads(text)["kind"] == "analyze"),
    ("csv", lambda text: text.startswith("model,block,layer,head,kv_head,")),
    ("jsonl", lambda text: len(text.splitlines()) == 8),
    ("txt", lambda text: "random baseline" in text and "\x1b[" not in text),
])
def test_output_file_format_from_extension(cli, tiny_bert, tmp_path, ext, check):
    out = tmp_path / f"result.{ext}"
    r = cli("analyze", tiny_bert, "-o", out)
    assert r.exit_code == 0, r.stderr
    assert r.stdout == ""
    assert check(out.read_text())


@pytest.mark.parametrize("args, needle", [
    (["--metrics", "symmetry,bogus"], "unknown metric 'bogus'; metrics: symmetry"),
    (["--layers", "9"], "--layers: 9 is out of range; encoder has layers 0-1"),
    (["--heads", "4"], "--heads: 4 is out of range"),
    (["--block", "decoder"], "this model's blocks are encoder"),
    (["--sort", "nope"], "--sort: 'nope'"),
    (["--top", "0"], "--top"),
    (["--precision", "float16"], "float16"),
    (["--by", "model"], "model"),
])
def test_bad_options_one_line(cli, tiny_bert, tmp_path, args, needle):
    out = tmp_path / "never.json"
    r = cli("analyze", tiny_bert, *args, "-o", out)
    assert r.exit_code == 2, r.stderr
    assert r.stdout == "" and not out.exists()
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr


def test_cuda_refused_without_gpu(cli, tiny_bert, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    r = cli("analyze", tiny_bert, "--device", "cuda")
    assert r.exit_code == 2 and r.stdout == ""
    assert "no CUDA device" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_basis_dependent_columns_are_marked(cli, tiny_bert):
    r = cli("analyze", tiny_bert, "-f", "table", "--metrics", "symmetry,cosine_qk,cka_kv", "--layers", "0")
    assert "cos_qk*=cosine_qk" in r.stdout and "cka_kv*" in r.stdout and "sym*" not in r.stdout
    assert "* not gauge-invariant (depends on the basis of the head space): cosine_qk, cka_kv" in r.stdout


def test_interrupted_run_leaves_no_file(cli, tiny_bert, tmp_path, monkeypatch):
    import qkinspect.cli.output as output

    def interrupted(doc, f):
        f.write('{"partial": ')
        raise KeyboardInterrupt

    monkeypatch.setattr(output, "write_json", interrupted)
    out = tmp_path / "r.json"
    r = cli("analyze", tiny_bert, "-o", out)
    assert r.exit_code == 130 and r.stdout == "" and "interrupted" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_zero_head_gives_null_and_a_warning_on_stderr(cli, tmp_path):
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(5)
    model = BertModel(BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                 intermediate_size=64, max_position_embeddings=16)).eval()
    with torch.no_grad():
        model.encoder.layer[0].attention.self.query.weight[8:16] = 0  # head 1 of 4 (d_head 8) reads nothing
    model.save_pretrained(tmp_path, safe_serialization=True)
    r = cli("analyze", tmp_path, "-f", "json", "--metrics", "symmetry")
    assert r.exit_code == 0
    d = validate(json.loads(r.stdout))
    assert [h["symmetry"] is None for h in d["heads"]] == [False, True, False, False]
    assert r.stderr.startswith("warning: ") and d["warnings"]
    rows = list(csv.DictReader(io.StringIO(cli("analyze", tmp_path, "-f", "csv", "--metrics", "symmetry").stdout)))
    assert rows[1]["symmetry"] == ""
