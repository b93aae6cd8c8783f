"""`qkinspect extract`: canonical per-head tensors with metadata, written atomically."""

from __future__ import annotations

import json
import os

import torch
from safetensors import safe_open

from qkinspect.loading import open_model


def test_extract_round_trip(cli, tiny_bert, tmp_path):
    out = tmp_path / "heads.safetensors"
    r = cli("extract", tiny_bert, "-o", out)
    assert r.exit_code == 0, r.stderr
    assert r.stdout == ""
    with safe_open(str(out), "pt") as f, open_model(tiny_bert) as m:
        meta = json.loads(f.metadata()["qkinspect"])
        keys = set(f.keys())
        for layer in m.layers():
            for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
                got = f.get_tensor(f"encoder.{layer.layer}.{name}")
                assert torch.equal(got, getattr(layer, name)), name
    assert len(keys) == 2 * 8
    assert f"wrote {len(keys)} tensors" in r.stderr
    assert (meta["schema"], meta["kind"]) == ("qkinspect/1", "extract")
    assert meta["model"]["model_type"] == "bert" and meta["model"]["blocks"][0]["n_heads"] == 4
    assert meta["layers"][0]["shapes"]["W_Q"] == [4, 32, 8] and meta["layers"][0]["shapes"]["W_O"] == [4, 8, 32]


def test_extract_selected_layers_of_demo(cli, tmp_path):
    out = tmp_path / "h.safetensors"
    r = cli("extract", "--layers", "5", "--block", "encoder", "-o", out)
    assert r.exit_code == 0, r.stderr
    with safe_open(str(out), "pt") as f:
        assert {k.rsplit(".", 1)[0] for k in f.keys()} == {"encoder.5"}
        assert tuple(f.get_tensor("encoder.5.W_Q").shape) == (12, 384, 32)


def test_extract_refuses(cli, tiny_bert, tmp_path):
    for args, message in [
        ((), "give -o"),
        (("-o", tmp_path / "h.pt"), "*.safetensors"),
        (("-o", tmp_path / "h.safetensors", "--layers", "2"), "encoder has layers 0-1"),
        (("-o", tmp_path / "nope" / "h.safetensors"), "does not exist"),
    ]:
        r = cli("extract", tiny_bert, *args)
        assert r.exit_code == 2, args
        assert r.stdout == ""
        assert len(r.stderr.strip().splitlines()) == 1 and message in r.stderr
    assert os.listdir(tmp_path) == []
