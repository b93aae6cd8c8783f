"""A model with q/k norms measured without --fold-qk-norm says plainly, in the table, on stderr and in the JSON
processing record, that the raw form is not what attention computes and how to get it; folded, nothing is said."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_fold_qk_norm import save_qwen3


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return save_qwen3(tmp_path_factory.mktemp("qwen3"), seed=7)


def flat(text: str) -> str:
    return " ".join(text.split())


def test_raw_measurement_of_q_k_norms_is_said_everywhere(cli, qwen3):
    r = cli("analyze", qwen3, "--format", "table", env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.stderr
    header = flat(r.stdout.split("layer  head")[0])
    assert "q/k norm not folded (decoder block)" in header and "not what attention computes" in header
    assert "--fold-qk-norm" in header
    notes = [line for line in r.stderr.splitlines() if "q/k norm not folded" in line]
    assert len(notes) == 1 and notes[0].startswith("note: ") and "--fold-qk-norm" in notes[0]
    doc = json.loads(cli("analyze", qwen3, "--format", "json").stdout)
    assert doc["processing"]["qk_norm_not_folded"] == ["decoder"]


def test_folded_says_nothing(cli, qwen3):
    r = cli("analyze", qwen3, "--fold-qk-norm", "--format", "table", env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.stderr
    assert "not folded" not in r.stdout + r.stderr
    doc = json.loads(cli("analyze", qwen3, "--fold-qk-norm", "--format", "json").stdout)
    assert doc["processing"]["qk_norm_not_folded"] == []


def test_a_model_without_q_k_norms_says_nothing(cli, tiny_bert):
    r = cli("analyze", tiny_bert, "--format", "json")
    assert "q/k norm" not in r.stderr and json.loads(r.stdout)["processing"]["qk_norm_not_folded"] == []
