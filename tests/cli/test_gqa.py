"""Grouped-query attention through the CLI: flags in `info`, KV groups in `analyze`, `spectrum`, `extract`."""

from __future__ import annotations

import json

import numpy as np
import torch
from safetensors import safe_open

from qkinspect.loading import open_model


def test_info_reports_gqa_and_rope(cli, tiny_llama):
    b = json.loads(cli("info", tiny_llama, "-f", "json").stdout)["model"]["blocks"][0]
    assert (b["name"], b["n_heads"], b["n_kv_heads"], b["positional"], b["flags"]) == ("decoder", 4, 2, "rope", ["gqa"])
    table = cli("info", tiny_llama, "-f", "table").stdout
    assert "rope (8 dims)" in table and "gqa" in table


def test_analyze_kv_heads_are_groups(cli, tiny_llama):
    d = json.loads(cli("analyze", tiny_llama, "-f", "json", "--layers", "0").stdout)
    assert [(h["head"], h["kv_head"]) for h in d["heads"]] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    r = cli("analyze", tiny_llama, "-f", "table", "--layers", "0")
    assert "rotary positions: the metrics describe the form at offset 0" in r.stdout


def test_spectrum_reads_the_heads_kv_group(cli, tiny_llama):
    with open_model(tiny_llama) as m:
        (L,) = m.layers(layers=[1])
    d = json.loads(cli("spectrum", tiny_llama, "--layer", "1", "--head", "1", "--matrix", "k", "-f", "json").stdout)
    assert d["kv_head"] == 0  # head 1 // (4 // 2)
    assert np.allclose(d["singular_values"], torch.linalg.svdvals(L.W_K[0].double()).numpy(), rtol=1e-4)
    d = json.loads(cli("spectrum", tiny_llama, "--layer", "1", "--head", "2", "-f", "json").stdout)
    M = L.W_Q[2].double() @ L.W_K[1].double().T
    assert np.allclose(d["singular_values"], torch.linalg.svdvals(M).numpy()[:8], rtol=1e-4, atol=1e-6)


def test_extract_keeps_kv_grouped(cli, tiny_llama, tmp_path):
    out = tmp_path / "h.safetensors"
    assert cli("extract", tiny_llama, "-o", out).exit_code == 0
    with safe_open(str(out), "pt") as f:
        assert tuple(f.get_tensor("decoder.1.W_Q").shape) == (4, 32, 8)
        assert tuple(f.get_tensor("decoder.1.W_K").shape) == (2, 32, 8)
        assert tuple(f.get_tensor("decoder.1.W_O").shape) == (4, 8, 32)
