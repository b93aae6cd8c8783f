"""Bits per byte of the held-out text: every evaluation and the summary's diff, against a hand computation for
character, byte and BPE tokens (nats per token × held-out tokens ÷ held-out UTF-8 bytes ÷ ln 2)."""

from __future__ import annotations

import json
import math

import pytest

from qkinspect.twin import run as twin_run
from qkinspect.twin.saved import read_twin
from tests.twin.conftest import TINY

BODY = "the café sat on the mat — a dog ran by the sea; 日本の猫. " * 160


@pytest.mark.parametrize("tokenizer", ["char", "byte", "bpe:300"])
def test_bits_per_byte_is_nats_per_token_times_tokens_per_byte(tmp_path, tokenizer):
    text = tmp_path / "t.txt"
    text.write_text(BODY, encoding="utf-8")
    result = twin_run.twin(tmp_path / "out", text=text, tokenizer=tokenizer, variants="share_qk", steps=3, seeds=2,
                           lr=1e-2, eval_every=3, **TINY)
    held = BODY[len(BODY) - max(1, int(len(BODY) * 0.1)):]  # the last tenth, as the twin holds it out
    size = len(held.encode("utf-8"))
    if tokenizer == "char":
        tokens = len(held)  # every held-out character is in the training text's table
    elif tokenizer == "byte":
        tokens = size
    else:
        from tokenizers import Tokenizer

        bpe = Tokenizer.from_str((tmp_path / "out" / "tokens" / "tokenizer.txt").read_text(encoding="utf-8"))
        tokens = len(bpe.encode(held).ids)
    assert result.setup["text"]["held_out_bytes"] == size and result.setup["text"]["held_out_tokens"] == tokens
    assert size > len(held)  # the text has characters of several bytes: the units differ
    factor = tokens / size / math.log(2)
    for p in result.points:
        assert p.val_bpb == pytest.approx(p.val_loss * factor, rel=1e-12)
    for r in result.runs:
        assert r.val_bpb == pytest.approx(r.val_loss * factor, rel=1e-12)
    std, tied = result.summaries
    assert std.val_bpb == pytest.approx(std.val_loss * factor) and tied.diff_bpb == pytest.approx(tied.diff * factor)
    doc = result.document()
    assert doc["summary"][1]["diff_bpb"] == pytest.approx(tied.diff * factor)
    assert "val_bpb" in doc["points"][0] and "bits_per_byte" in doc["setup"]["statistics"]


def test_a_folder_without_its_bytes_has_no_bits_per_byte(tmp_path, small_text):
    twin_run.twin(tmp_path, text=small_text, variants="share_qk", steps=2, seeds=1, lr=1e-2, **TINY)
    manifest = json.loads((tmp_path / "twin.json").read_text())
    del manifest["setup"]["text"]["held_out_bytes"]  # as a folder written before the bytes were recorded
    (tmp_path / "twin.json").write_text(json.dumps(manifest))
    got = read_twin(tmp_path)
    assert all(p.val_bpb is None for p in got.points) and got.summaries[1].diff_bpb is None
