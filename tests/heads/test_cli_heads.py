"""`qkinspect heads`: its outputs (JSON that reads back, a CSV row per head, the table at 80 columns, the tidy
export), plot --kind heads and the report from a saved document, and bad input as one line with exit 2."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from qkinspect.cli.app import app
from tests.experiment import tiny_models
from tests.one_line import one_error_line

SMALL = ["--sequences", "6", "--length", "12", "--windows", "3", "--window", "24", "--resamples", "100",
         "--permutations", "100"]


@pytest.fixture
def cli():
    runner = CliRunner()
    return lambda *args, **kw: runner.invoke(app, [str(a) for a in args], **kw)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny_models.llama(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def saved(llama, tmp_path_factory):
    out = tmp_path_factory.mktemp("saved") / "heads.json"
    r = CliRunner().invoke(app, ["heads", str(llama), *SMALL, "-o", str(out)])
    assert r.exit_code == 0, r.stderr
    return out


def test_json_csv_and_export(cli, llama, saved, tmp_path):
    from tests.cli.schema import validate

    doc = validate(json.loads(saved.read_text()))
    assert doc["kind"] == "heads" and len(doc["heads"]) == 12 and doc["relations"]
    r = cli("heads", llama, *SMALL, "-f", "csv", "--export", tmp_path / "long.csv")
    assert r.exit_code == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert len(rows) == 12 and float(rows[0]["induction"]) == pytest.approx(doc["heads"][0]["induction"])
    long = list(csv.DictReader((tmp_path / "long.csv").open()))
    assert {x["kind"] for x in long} == {"behaviour", "weight"} and len(long) == 12 * (6 + len(doc["settings"]
                                                                                              ["metrics"]))


def test_table_fits_80_columns(cli, llama):
    r = cli("heads", llama, *SMALL, "-f", "table", env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.stderr
    assert "strongest heads per score" in r.stdout and "Spearman's ρ" in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 80


def test_plot_and_report_read_the_saved_document(cli, saved, tmp_path):
    r = cli("plot", saved, "--kind", "heads", "--metric", "symmetry", "--score", "self", "-o", tmp_path / "s.png")
    assert r.exit_code == 0, r.stderr
    assert (tmp_path / "s.png").stat().st_size > 1000
    assert cli("report", saved, "-o", tmp_path / "r.pdf").exit_code == 0
    r = cli("report", saved, "--html", "-o", tmp_path / "r.html")
    assert r.exit_code == 0 and "<svg" in (tmp_path / "r.html").read_text()
    one_error_line(cli("plot", saved, "--score", "nope", "-o", tmp_path / "x.png"), "--score nope")
    one_error_line(cli("plot", saved, "--kind", "rank", "-o", tmp_path / "x.png"), "--kind rank")


@pytest.mark.parametrize("args, says", [
    (["--sequences", "0"], "--sequences 0"),
    (["--length", "40"], "--length 40"),
    (["--length", "8", "--window", "100"], "--window 100"),
    (["--relate", "nope"], "--relate nope"),
])
def test_bad_options_are_one_line(cli, llama, args, says):
    one_error_line(cli("heads", llama, *args), says)


def test_a_text_too_short_is_one_line(cli, llama, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("ab")
    one_error_line(cli("heads", llama, "--length", "8", "--window", "32", "--text", short), "--text",
                   "fewer than one window")


def test_a_decoder_without_its_lm_head_is_one_line(cli, tmp_path):
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(vocab_size=len(tiny_models.VOCAB), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    LlamaModel(cfg).save_pretrained(tmp_path / "bare")
    tiny_models.save_tokenizer(tmp_path / "bare")
    one_error_line(cli("heads", tmp_path / "bare", "--length", "8", "--window", "32"), "lm_head")


def test_a_family_without_eager_probabilities_here_is_one_line(cli, tmp_path):
    from transformers import OPTConfig, OPTForCausalLM

    OPTForCausalLM(OPTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, ffn_dim=32,
                             vocab_size=len(tiny_models.VOCAB), max_position_embeddings=64)).save_pretrained(
        tmp_path / "opt")
    tiny_models.save_tokenizer(tmp_path / "opt")
    one_error_line(cli("heads", tmp_path / "opt", "--length", "8", "--window", "32"), "model_type 'opt'",
                   "eager attention")


def test_the_request_is_checked_without_torch_in_the_callers_names():
    import subprocess
    import sys

    code = ("import sys\nfrom qkinspect.heads.request import check_request, CLI_NAMES\n"
            "check_request(sequences=4, length=8, relate='symmetry')\n"
            "try:\n    check_request(sequences=0, names=CLI_NAMES)\nexcept Exception as e:\n    print(e)\n"
            "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["--sequences 0: expected 1 to 65536", "False"]


def test_fold_qk_norm_reaches_the_weight_metrics(tmp_path):
    import qkinspect

    path = tiny_models.qwen3(tmp_path / "qwen3")
    small = dict(sequences=4, length=8, windows=2, window=24, resamples=50, permutations=50, relate="symmetry")
    raw = qkinspect.heads(str(path), **small)
    folded = qkinspect.heads(str(path), fold_qk_norm=True, **small)
    assert folded.settings.fold_qk_norm and not raw.settings.fold_qk_norm
    assert any(abs(a.weights["symmetry"] - b.weights["symmetry"]) > 1e-4
               for a, b in zip(raw.records, folded.records, strict=True))
    assert [a.scores for a in raw.records] == [b.scores for b in folded.records]  # behaviour: the same model


def test_an_atlas_of_heads_documents_holds_the_scores_across_models(cli, saved, tmp_path):
    import qkinspect
    from qkinspect.atlas.saved import read_atlas

    gpt2 = tiny_models.gpt2(tmp_path / "gpt2")
    other = qkinspect.heads(str(gpt2), sequences=4, length=8, windows=2, window=24, resamples=50,
                            permutations=50).save(tmp_path / "gpt2.json")
    r = cli("atlas", saved, other, "--out", tmp_path / "atlas", "-f", "json")
    assert r.exit_code == 0, r.stderr
    atlas = read_atlas(tmp_path / "atlas")
    assert {"induction", "previous_token", "symmetry"} <= set(atlas.metrics)
    ind = [x for x in atlas.records if x.metric == "induction" and x.scope == "layer"]
    assert len({x.model for x in ind}) == 2
    doc = json.loads(saved.read_text())
    mine = [h["induction"] for h in doc["heads"] if h["layer"] == 1]
    want = float(np.median(mine))
    assert any(x.layer == 1 and x.median == pytest.approx(want) for x in ind)  # the atlas's median of the scores
    assert cli("plot", tmp_path / "atlas", "--kind", "depth", "--metric", "induction",
               "-o", tmp_path / "d.png").exit_code == 0
    assert doc["processing"]["metrics"]
