"""Models with several attention blocks (encoder, decoder, cross): selection by --block in every command."""

from __future__ import annotations

import json

from safetensors import safe_open


def test_info_lists_three_blocks(cli, tiny_bart):
    blocks = json.loads(cli("info", tiny_bart, "-f", "json").stdout)["model"]["blocks"]
    assert [(b["name"], b["n_layers"]) for b in blocks] == [("encoder", 1), ("decoder", 2), ("cross", 2)]


def test_analyze_block_selection(cli, tiny_bart):
    d = json.loads(cli("analyze", tiny_bart, "--block", "cross", "-f", "json").stdout)
    assert {h["block"] for h in d["heads"]} == {"cross"} and len(d["heads"]) == 2 * 4
    d = json.loads(cli("analyze", tiny_bart, "--block", "encoder,decoder", "--layers", "0", "-f", "json").stdout)
    assert [h["block"] for h in d["heads"]] == ["encoder"] * 4 + ["decoder"] * 4
    r = cli("analyze", tiny_bart, "--block", "encoder", "--layers", "1")
    assert r.exit_code == 2 and "encoder has layers 0-0" in r.stderr


def test_spectrum_needs_one_block(cli, tiny_bart):
    r = cli("spectrum", tiny_bart, "--layer", "0", "--head", "0")
    assert r.exit_code == 2 and r.stdout == ""
    assert "several blocks (encoder, decoder, cross): choose one with --block" in r.stderr
    d = json.loads(cli("spectrum", tiny_bart, "--layer", "1", "--head", "3", "--block", "cross", "-f", "json").stdout)
    assert (d["block"], d["layer"], d["head"]) == ("cross", 1, 3) and len(d["singular_values"]) == 8


def test_extract_one_block(cli, tiny_bart, tmp_path):
    out = tmp_path / "x.safetensors"
    assert cli("extract", tiny_bart, "-b", "cross", "-o", out).exit_code == 0
    with safe_open(str(out), "pt") as f:
        assert {k.split(".")[0] for k in f.keys()} == {"cross"}
        assert {k.rsplit(".", 1)[0] for k in f.keys()} == {"cross.0", "cross.1"}
