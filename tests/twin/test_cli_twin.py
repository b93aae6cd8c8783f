"""`qkinspect twin`: one error line and exit 2 for bad input, before any work; exit 3 with the failed runs listed
and the others kept; the sweep engine's Dask path."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from qkinspect.cli.app import app
from tests.one_line import one_error_line
from tests.twin.conftest import text_file

TINY = ["--layers", "1", "--d-model", "16", "--heads", "2", "--context", "8", "--batch", "2", "--eval-windows", "4",
        "--steps", "2", "--seeds", "1"]


def twin(*args):
    return CliRunner().invoke(app, ["twin", *map(str, args)])


@pytest.mark.parametrize("args, says", [
    (["--variants", "shared_qk"], ["--variants", "did you mean share_qk"]),
    (["--variants", "rank:x"], ["--variants", "rank:8"]),
    (["--variants", "symmetric:3"], ["takes no argument"]),
    (["--lr", "fast"], ["--lr"]),
    (["--lr", "0"], ["--lr"]),
    (["--tokenizer", "bpe:3"], ["--tokenizer"]),
    (["--d-model", "30", "--heads", "4"], ["--d-model", "--heads"]),
    (["--d-model", "12", "--heads", "4"], ["--d-model", "--heads", "even"]),
    (["--steps", "0"], ["--steps"]),
    (["--text", "missing.txt"], ["--text", "no such file"]),
    (["--config", "missing.json"], ["--config"]),
    (["--scheduler", "http://x:1"], ["--scheduler"]),
    (["--margin", "-1"], ["--margin"]),
    (["--variants", "rank:3"], ["--variants rank:3", "pairs", "rank 2", "even"]),
    (["--variants", "share_qk,rank:5", "--match-params"], ["--variants rank:5", "pairs"]),
])
def test_bad_input_is_one_line(tmp_path, args, says):
    one_error_line(twin("--out", tmp_path / "out", *args), *says)
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_a_config_file_it_cannot_use_is_one_line(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"model_type": "bert"}))
    one_error_line(twin("--out", tmp_path / "out", "--config", tmp_path / "c.json"), "--config", "llama or gpt2")


def test_odd_ranks_are_refused_under_llama_only(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 16, "num_attention_heads": 2,
                               "num_key_value_heads": 2, "intermediate_size": 32, "num_hidden_layers": 1,
                               "max_position_embeddings": 8, "vocab_size": 10}))
    one_error_line(twin("--out", tmp_path / "out", "--config", cfg, "--variants", "rank:1"), "--variants rank:1",
                   "pairs")
    text = text_file(tmp_path / "t.txt", 2000)
    got = twin("--out", tmp_path / "g", "--arch", "gpt2", "--text", text, "--variants", "rank:3", "--workers", "0",
               *TINY, "-f", "json")
    assert got.exit_code == 0, got.output  # no rotary pairs under gpt2: rank:3 is rank 3


def test_a_text_too_short_for_a_window_is_one_line(tmp_path):
    (tmp_path / "t.txt").write_text("abc")
    one_error_line(twin("--out", tmp_path / "out", "--text", tmp_path / "t.txt", *TINY), "--context")


def test_a_folder_of_another_setup_is_refused(tmp_path):
    text = text_file(tmp_path / "t.txt", 2000)
    assert twin("--out", tmp_path / "out", "--text", text, "--workers", "0", *TINY, "-f", "json").exit_code == 0
    one_error_line(twin("--out", tmp_path / "out", "--text", text, "--workers", "0", *TINY, "--batch", "3"),
                   "--out", "another setup", "--batch 2, not --batch 3")


def test_failed_runs_exit_3_and_the_others_are_kept_on_dask(tmp_path):
    """wq_identity needs heads × head size = d_model: on a config with a narrower head it fails in its task."""
    cfg = {"model_type": "llama", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
           "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 4, "max_position_embeddings": 8}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    text = text_file(tmp_path / "t.txt", 2000)
    r = twin("--out", tmp_path / "out", "--text", text, "--config", tmp_path / "c.json", "--variants",
             "wq_identity,share_qk", "--workers", "1", *TINY, "-o", tmp_path / "runs.csv")
    assert r.exit_code == 3, r.stderr
    assert "wq_identity" in r.stderr and "heads × head size" in r.stderr and "Traceback" not in r.stderr
    runs = sorted(p.name for p in (tmp_path / "out" / "runs").iterdir())
    assert runs == ["share_qk-s0-lr0.001.json", "standard-s0-lr0.001.json"]
    assert (tmp_path / "runs.csv").read_text().startswith("variant,seed,lr,step,tokens,train_loss,val_loss")
    doc = json.loads((tmp_path / "out" / "twin.json").read_text())
    assert [f["variant"] for f in doc["failures"]] == ["wq_identity"]


def test_outputs(tmp_path):
    text = text_file(tmp_path / "t.txt", 2000)
    base = ["--out", tmp_path / "out", "--text", text, "--workers", "0", "--track-every", "1", *TINY]
    assert twin(*base, "-o", tmp_path / "s.ndjson", "--rows", "summary").exit_code == 0
    rows = [json.loads(line) for line in (tmp_path / "s.ndjson").read_text().splitlines()]
    assert [r["variant"] for r in rows] == ["standard", "share_qk"] and rows[1]["verdict"] == "can't tell"
    r = twin(*base, "-o", tmp_path / "t.parquet", "--rows", "trajectories")
    assert r.exit_code == 0, r.stderr
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "t.parquet")
    assert table.column_names == ["variant", "seed", "lr", "step", "layer", "head", "metric", "value"]
    assert set(table.column("step").to_pylist()) == {0, 1, 2}
    doc = json.loads(twin(*base, "-f", "json").stdout)
    assert doc["kind"] == "twin" and doc["setup"]["tokenizer"]["kind"] == "char"
    from tests.cli.schema import validate

    validate(doc)
    table = twin(*base, "-f", "table").stdout
    assert "verdict" in table and "share_qk" in table
