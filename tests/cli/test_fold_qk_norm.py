"""`--fold-qk-norm`: every command that takes --fold-ln takes it too, passes it to `qkinspect.analyze`, records it in
the processing flags, and gives what the library gives; a selection without q/k norms is refused in one line."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch
import typer

import qkinspect
from qkinspect.cli.app import app

FOLD_COMMANDS = ("analyze", "spectrum", "compare", "plot", "report", "sweep", "composition", "directions", "heads")


def save_qwen3(path, seed: int):
    """A tiny Qwen3 (GQA, per-head q/k RMSNorm) whose q/k-norm gains are random, not the initial ones."""
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=16)
    model = Qwen3Model(cfg).eval()
    with torch.no_grad():
        for layer in model.layers:
            layer.self_attn.q_norm.weight.uniform_(0.3, 3.0)
            layer.self_attn.k_norm.weight.uniform_(0.3, 3.0)
            layer.input_layernorm.weight.uniform_(0.5, 2.0)
    model.save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return save_qwen3(tmp_path_factory.mktemp("qwen3_a"), seed=7)


@pytest.fixture(scope="module")
def qwen3_b(tmp_path_factory):
    return save_qwen3(tmp_path_factory.mktemp("qwen3_b"), seed=8)


def head_values(heads) -> dict[tuple, dict[str, float]]:
    """(block, layer, head) -> finite metric values (JSON writes NaN as null), from records or JSON heads."""
    out = {}
    for h in heads:
        h = h if isinstance(h, dict) else {"block": h.block, "layer": h.layer, "head": h.head, **h.values}
        out[(h["block"], h["layer"], h["head"])] = {k: v for k, v in h.items()
                                                    if isinstance(v, float) and math.isfinite(v)}
    return out


def assert_close(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key in want:
        assert got[key].keys() == want[key].keys(), key
        for m, v in want[key].items():
            assert got[key][m] == pytest.approx(v, rel=1e-6, abs=1e-9, nan_ok=True), (key, m)


def differ(a: dict, b: dict, metric: str) -> bool:
    return any(abs(a[k][metric] - b[k][metric]) > 1e-4 for k in a)


def json_of(cli, *args):
    r = cli(*args, "--format", "json")
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("fold_ln", [False, True])
def test_analyze_equals_the_library(cli, qwen3, fold_ln):
    extra = ["--fold-ln"] if fold_ln else []
    doc = json_of(cli, "analyze", qwen3, "--fold-qk-norm", *extra)
    assert doc["processing"]["fold_qk_norm"] is True and doc["processing"]["fold_ln"] is fold_ln
    folded = qkinspect.analyze(str(qwen3), fold_qk_norm=True, fold_ln=fold_ln)
    assert_close(head_values(doc["heads"]), head_values(folded.heads))
    raw = qkinspect.analyze(str(qwen3), fold_ln=fold_ln)
    assert differ(head_values(folded.heads), head_values(raw.heads), "symmetry")  # the flag changes the numbers
    plain = json_of(cli, "analyze", qwen3, *extra)
    assert plain["processing"]["fold_qk_norm"] is False
    assert_close(head_values(plain["heads"]), head_values(raw.heads))


def test_table_and_csv_say_it(cli, qwen3, tmp_path):
    r = cli("analyze", qwen3, "--fold-qk-norm", "--format", "table")
    assert r.exit_code == 0, r.stderr
    assert "fold_qk_norm" in r.stdout
    assert cli("analyze", qwen3, "--fold-qk-norm", "-o", tmp_path / "h.csv").exit_code == 0
    import pandas as pd

    rows = pd.read_csv(tmp_path / "h.csv")
    folded = head_values(qkinspect.analyze(str(qwen3), fold_qk_norm=True).heads)
    for _, row in rows.iterrows():
        assert row["symmetry"] == pytest.approx(folded[(row["block"], row["layer"], row["head"])]["symmetry"])


def test_spectrum_equals_the_library(cli, qwen3):
    doc = json_of(cli, "spectrum", qwen3, "--layer", "1", "--head", "3", "--fold-qk-norm")
    assert doc["processing"]["fold_qk_norm"] is True
    spectra = {}
    for fold in (True, False):
        r = qkinspect.analyze(str(qwen3), layers=[1], heads=[3], metrics=["symmetry"], fold_qk_norm=fold,
                              spectra=["qk", "qk_eig"])
        spectra[fold] = np.asarray(r.spectra[("decoder", 1, 3)]["qk"], dtype=float)
    got = np.asarray(doc["singular_values"], dtype=float)
    np.testing.assert_allclose(got, spectra[True], rtol=1e-6)
    assert not np.allclose(got, spectra[False], rtol=1e-3)


def test_compare_equals_the_library(cli, qwen3, qwen3_b):
    doc = json_of(cli, "compare", qwen3, qwen3_b, "--fold-qk-norm", "--metrics", "symmetry")
    assert doc["processing"]["fold_qk_norm"] is True
    a = head_values(qkinspect.analyze(str(qwen3), metrics=["symmetry"], fold_qk_norm=True).heads)
    b = head_values(qkinspect.analyze(str(qwen3_b), metrics=["symmetry"], fold_qk_norm=True).heads)
    for row in doc["heads"]:
        key = (row["block"], row["layer"], row["head"])
        assert row["delta_symmetry"] == pytest.approx(b[key]["symmetry"] - a[key]["symmetry"], abs=1e-9)
    r = cli("compare", qwen3, qwen3_b, "--fold-qk-norm", "--metrics", "symmetry", "--format", "table")
    assert r.stdout.count("fold_qk_norm") == 2  # on the A and B lines


@pytest.mark.parametrize("command, out", [("plot", "f.svg"), ("report", "r.html")])
def test_figures_and_reports_fold(cli, monkeypatch, qwen3, tmp_path, command, out):
    from qkinspect.analysis import run

    seen = []
    analyze = run.analyze

    def recording(*args, **kwargs):  # the CLI passes the request it checked, in its own names
        seen.append(kwargs["request"])
        return analyze(*args, **kwargs)

    monkeypatch.setattr(run, "analyze", recording)
    extra = ["--html"] if command == "report" else []
    r = cli(command, qwen3, "--fold-qk-norm", "--layers", "0", *extra, "-o", tmp_path / out)
    assert r.exit_code == 0, r.stderr
    assert seen and all(k.fold_qk_norm is True for k in seen)
    if command == "report":
        assert "q/k-norm gains folded" in (tmp_path / out).read_text()


@pytest.mark.parametrize("command", FOLD_COMMANDS)
def test_model_without_qk_norm_is_refused(cli, tiny_bert, tmp_path, command):
    """As --fold-ln is refused on a model without norms (docs/metrics.md, Processing): exit 2, one line, no file."""
    args = {"analyze": [tiny_bert], "spectrum": [tiny_bert], "compare": [tiny_bert, tiny_bert],
            "plot": [tiny_bert, "-o", tmp_path / "f.png"], "report": [tiny_bert, "-o", tmp_path / "r.pdf"],
            "sweep": [tiny_bert, "--out", tmp_path / "sweep", "--workers", "1"], "composition": [tiny_bert],
            "directions": [tiny_bert], "heads": [tiny_bert]}[command]
    if command == "sweep":
        pytest.importorskip("distributed", reason="the sweep needs the sweep extra")
    r = cli(command, *args, "--fold-qk-norm")
    assert r.exit_code == 2, r.stderr
    assert r.stdout == ""
    assert r.stderr.strip().splitlines() == ["error: --fold-qk-norm: the selected blocks have no q/k norm"]
    assert os.listdir(tmp_path) == []


def test_every_command_with_fold_ln_has_fold_qk_norm(cli):
    group = typer.main.get_command(app)
    with_fold_ln = {name for name, cmd in group.commands.items()
                    if any("--fold-ln" in p.opts for p in cmd.params)}
    # The atlas folds q/k norms per model, only where a model has them (docs/atlas.md); the others are measured as
    # stored, and without the option the raw q/k-norm rows are flagged.
    assert with_fold_ln == set(FOLD_COMMANDS) | {"atlas"}
    assert "--fold-qk-norm" in {o for p in group.commands["atlas"].params for o in p.opts}
    for name in with_fold_ln - {"atlas"}:
        opts = {o for p in group.commands[name].params for o in p.opts}
        assert "--fold-qk-norm" in opts, name
        r = cli(name, "--help")
        assert "--fold-qk-norm" in r.stdout and "Qwen3" in r.stdout, name
