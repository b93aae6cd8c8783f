"""`qkinspect experiment`: output formats, the documented fields, and one-line refusals."""

from __future__ import annotations

import csv
import io
import json

import pytest
from typer.testing import CliRunner

from qkinspect.cli.app import app
from tests.experiment import tiny_models as tiny


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny.llama(tmp_path_factory.mktemp("cli_experiment") / "llama")


def cli(*args):
    return CliRunner().invoke(app, ["experiment", *map(str, args)])


SMALL = ("--tokens", "64", "--window", "32")


def test_json_document(llama):
    r = cli(llama, "--edit", "share_qk,rank:4", "--layers", "1", "--heads", "0-1", *SMALL, "--format", "json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "qkinspect/1" and doc["kind"] == "experiment"
    assert doc["model"]["model_type"] == "llama"
    m = doc["measure"]
    assert (m["kind"], m["tokens"], m["windows"], m["window"], m["scored"]) == ("causal", 64, 2, 32, 62)
    assert m["text"].startswith("pydoc_data.topics")
    assert set(doc["predictors"]) == {"share_qk", "rank:4", "ablate"}
    runs = doc["runs"]
    assert [(x["edit"], x["head"]) for x in runs] == [
        ("share_qk", 0), ("rank:4", 0), ("ablate", 0), ("share_qk", 1), ("rank:4", 1), ("ablate", 1)]
    for x in runs:
        assert {"scope", "layer", "loss", "dloss", "dloss_ratio_ablate", "predicted", "offset0_only"} <= set(x)
        assert x["dloss"] == pytest.approx(x["loss"] - doc["baseline"])


def test_csv_rows_and_table(llama, tmp_path):
    out = tmp_path / "runs.csv"
    r = cli(llama, "--edit", "symmetric", "--scope", "layer", "--no-reference", *SMALL, "-o", out)
    assert r.exit_code == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [(x["edit"], x["scope"], x["layer"], x["head"]) for x in rows] == [
        ("symmetric", "layer", str(i), "") for i in range(3)]
    r = cli(llama, "--edit", "ablate", "--layers", "0", "--heads", "3", *SMALL, "--format", "table")
    assert r.exit_code == 0, r.stderr
    assert "baseline" in r.stdout and "ablate" in r.stdout and "Δloss" in r.stdout


def test_table_fits_80_columns_without_cutting(llama, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    r = cli(llama, "--edit", "share_qk,share_qkv,rank:4", "--layers", "0", "--heads", "0-1", *SMALL,
            "--format", "table")
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "…" not in r.stdout, r.stdout
    table = [ln for ln in lines if ln.startswith(("share_qk", "share_qkv", "rank:4", "ablate"))]
    assert len(table) == 8 and all(len(ln) <= 80 for ln in table), r.stdout
    assert any(ln.startswith("columns: ±=standard error of the exact Δloss, Δ/Δabl=") for ln in lines)


@pytest.mark.parametrize("args,message", [
    (("--edit", "share_kq"), "unknown edit 'share_kq'"),
    (("--edit", "rank:x"), "rank takes a whole number"),
    (("--layers", "9"), "--layers: 9 is out of range; decoder has layers 0-2"),
    (("--window", "1000"), "--window 1000: this model takes at most 64 positions"),  # the library: window=1000
    (("--text", "/nonexistent/t.txt"), "/nonexistent/t.txt: cannot read --text (no such file)"),
    (("--scope", "all"), "all"),
])
def test_refusals_are_one_line_exit_2(llama, args, message):
    r = cli(llama, *SMALL, *args)
    assert r.exit_code == 2
    assert message in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_a_folder_without_a_tokenizer_says_so(tmp_path):
    folder = tiny.bert(tmp_path / "bert")
    for f in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / f).unlink(missing_ok=True)
    r = cli(folder, "--edit", "ablate", *SMALL)
    assert r.exit_code == 2 and "--tokenizer" in r.stderr and r.stderr.count("\n") == 1
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(tiny.VOCAB) + "\n")
    r = cli(folder, "--edit", "ablate", "--layers", "0", "--heads", "0", "--tokenizer", vocab, *SMALL,
            "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["measure"]["kind"] == "masked"


def test_estimate_in_json_csv_and_table(llama, tmp_path, monkeypatch):
    r = cli(llama, "--edit", "share_qk", "--layers", "2", "--estimate", "--probes", "4", "--verify", "2", *SMALL,
            "--format", "json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["estimate"]["probes"] == 4 and [a["edit"] for a in doc["estimate"]["agreement"]] == [
        "share_qk", "ablate"]
    assert any("tokens were scored" in n for n in doc["notes"])  # 62 < 1024 scored tokens
    for x in doc["runs"]:
        assert {"dloss_se", "dloss_estimate", "dloss_estimate_se", "moved", "unreliable"} <= set(x)
        assert x["dloss_estimate"] is not None
    assert sum(x["dloss"] is not None for x in doc["runs"]) == 4
    out = tmp_path / "map.csv"
    assert cli(llama, "--edit", "share_qk", "--layers", "2", "--estimate", "--probes", "4", *SMALL,
               "-o", out).exit_code == 0
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert len(rows) == 8 and all(x["dloss_estimate"] for x in rows)
    monkeypatch.setenv("COLUMNS", "80")
    r = cli(llama, "--edit", "share_qk", "--layers", "2", "--heads", "0", "--estimate", "--probes", "4", *SMALL,
            "--format", "table")
    assert r.exit_code == 0, r.stderr
    assert all(len(ln) <= 80 for ln in r.stdout.splitlines()), r.stdout
    assert "agreement share_qk: Spearman's rank correlation of estimate and exact Δloss ρ" in " ".join(r.stdout.split())
    assert "est" in r.stdout and "±MC" in r.stdout


def test_notes_go_to_stderr_whatever_o_is(llama, tmp_path):
    """The note about too few scored tokens reaches the terminal (stderr) with -o FILE, in a pipe and with a table;
    the JSON keeps it and the table itself does not repeat it (issue 44)."""
    args = (llama, "--edit", "ablate", "--layers", "0", "--heads", "0", *SMALL)
    for extra in (("-o", tmp_path / "runs.json"), ("-o", tmp_path / "runs.csv"), ("--format", "json"),
                  ("--format", "table")):
        r = cli(*args, *extra)
        assert r.exit_code == 0, r.stderr
        assert "note: only 62 tokens were scored" in r.stderr, extra
        assert "tokens were scored" not in r.stdout.replace('"only 62 tokens', ""), extra  # JSON keeps it, as data
    assert any("tokens were scored" in n for n in json.loads((tmp_path / "runs.json").read_text())["notes"])


def test_every_line_fits_80_columns(llama, monkeypatch):
    """The title (about 100 characters) and the `columns:` legend (269) wrap at word boundaries (issue 44)."""
    monkeypatch.setenv("COLUMNS", "80")
    r = cli(llama, "--edit", "share_qk,rank:4", "--layers", "0", "--heads", "0-1", *SMALL, "--rotary", "offset0",
            "--format", "table")
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert all(len(ln) <= 80 for ln in lines), r.stdout
    text = " ".join(r.stdout.split())
    assert "next-token cross-entropy on" in text and "baseline" in lines[0] + lines[1]
    assert "columns: ±=standard error of the exact Δloss, Δ/Δabl=Δloss / Δloss(ablate) of the same heads" in text
    assert "pred of an edit without a prediction" in text


def test_exact_runs_carry_their_standard_error(llama):
    r = cli(llama, "--edit", "ablate", "--layers", "0", "--heads", "0", *SMALL, "--format", "json")
    (run,) = json.loads(r.stdout)["runs"]
    assert run["dloss_se"] > 0 and run["dloss_estimate"] is None


@pytest.mark.parametrize("args,message", [
    (("--estimate", "--scope", "layer"), "use it with --scope head"),
    (("--verify", "3"), "--verify applies to --estimate only"),
    (("--estimate", "--probes", "1"), "--probes 1"),
])
def test_estimate_refusals_are_one_line(llama, args, message):
    r = cli(llama, *SMALL, *args)
    assert r.exit_code == 2 and message in r.stderr and r.stderr.count("\n") == 1


def test_experiment_documents_follow_the_schema(llama):
    import copy

    import jsonschema

    from tests.cli.schema import validate

    for extra in ((), ("--estimate", "--probes", "4", "--verify", "2")):
        doc = json.loads(cli(llama, "--edit", "share_qk", "--layers", "2", *SMALL, *extra, "--format", "json").stdout)
        validate(doc)
    bad = copy.deepcopy(doc)
    bad["runs"][0]["dloss_se"] = -1.0
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
