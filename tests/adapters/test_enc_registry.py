"""The registry knows every encoder and encoder-decoder family, each one is proven by a test, and an unknown
model_type is refused with the list of supported ones."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from qkinspect.cli.app import app
from qkinspect.errors import UnsupportedModelError
from qkinspect.loading import adapter_for, open_model, supported_model_types
from tests.adapters import test_enc_seq2seq, test_encoders

ENCODER_FAMILIES = {
    "bert", "roberta", "xlm-roberta", "electra", "camembert", "distilbert", "albert", "deberta-v2", "modernbert",
    "mpnet", "vit", "deit", "clip", "clip_text_model", "clip_vision_model", "reformer",
    "t5", "mt5", "umt5", "bart", "marian", "whisper",
}
PROVEN_ELSEWHERE = {"modernbert", "reformer"}  # test_enc_modernbert.py, test_enc_reformer.py


def test_every_family_is_registered_and_proven():
    assert ENCODER_FAMILIES <= set(supported_model_types())
    proven = set(test_encoders.CASES) | set(test_enc_seq2seq.CASES) | PROVEN_ELSEWHERE
    assert ENCODER_FAMILIES <= proven


@pytest.fixture
def unknown(tmp_path):
    folder = tmp_path / "odd"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "not-a-transformer", "hidden_size": 8}))
    (folder / "model.safetensors").write_bytes(b"")
    return folder


def test_unknown_model_type_lists_supported(unknown):
    with pytest.raises(UnsupportedModelError) as e:
        open_model(unknown)
    msg = str(e.value)
    assert "'not-a-transformer' is not supported" in msg
    for mt in ("bert", "t5", "whisper", "clip", "reformer", "modernbert"):
        assert mt in msg.split("supported:")[1]
    with pytest.raises(UnsupportedModelError):
        adapter_for("not-a-transformer")


def test_cli_refuses_unknown_model_type_in_one_line(unknown):
    r = CliRunner().invoke(app, ["info", str(unknown)])
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "not-a-transformer" in lines[0] and "deberta-v2" in lines[0]
    assert r.stdout == ""
