"""What the twin shows (issue 44): verdicts and notes on stderr whatever -o is, a warning for a learning rate at
the edge of its grid, no transformers bars, singular words, --help without `None`, 80 columns; and from Python,
progress through qkinspect.progress, a short repr, and empty kinds of records as frames with their columns."""

from __future__ import annotations

import io
import re

import pytest
from typer.testing import CliRunner

import qkinspect
from qkinspect.cli.app import app
from qkinspect.progress import Lines
from qkinspect.terminal.twin import render_twin
from tests.twin.conftest import TINY, text_file

CLI_TINY = ["--layers", "1", "--d-model", "16", "--heads", "2", "--context", "8", "--batch", "2", "--eval-windows",
            "4", "--steps", "2", "--seeds", "1", "--workers", "0"]


def twin(*args):
    return CliRunner().invoke(app, ["twin", *map(str, args)])


def test_with_o_file_the_verdicts_notes_and_edge_warnings_reach_stderr(tmp_path):
    text = text_file(tmp_path / "t.txt", 2000)
    args = ["--out", tmp_path / "out", "--text", text, *CLI_TINY, "--lr", "1e-3,2e-3", "--save-checkpoints"]
    r = twin(*args, "-o", tmp_path / "runs.csv")
    assert r.exit_code == 0, r.stderr
    err = r.stderr
    assert re.search(r"^note: twin: against standard \(held-out loss, 1 seed\): share_qk can't tell "
                     r"\([+-]\d\.\d{4}\)$", err, re.M), err
    edges = [line for line in err.splitlines() if line.startswith("warning: learning rate")]
    assert edges and all(re.search(r"learning rate 0\.00[12], the (smallest|largest) tried, chosen for", e)
                         for e in edges)
    assert "share_qk" in "".join(edges) and "standard" in "".join(edges)
    assert "Writing model shards" not in err and "\r" not in err  # transformers' bars silenced
    # the table on stdout: the verdicts and notes are in it, the warnings still on stderr
    r = twin(*args, "-f", "table")
    assert r.exit_code == 0 and "verdict" in r.stdout
    assert "against standard" not in r.stderr and r.stderr.count("warning: learning rate") == len(edges)
    assert "1 seed;" in r.stdout and "1 seeds" not in r.stdout + r.stderr


def test_help_names_the_rows_kinds():
    r = CliRunner().invoke(app, ["twin", "--help"], env={"COLUMNS": "200"})
    line = next(x for x in r.stdout.splitlines() if x.strip("│ ").startswith("--rows"))
    assert "None" not in line and "runs|trajectories|summary|lr" in line


def _summary(variants: list[str], seeds: int = 3) -> list[dict]:
    return [{"variant": v, "params": 825_728, "lr": 0.001, "seeds": seeds, "val_loss": 1.62, "diff": 0.07,
             "ci_low": 0.031, "ci_high": 0.11, "verdict": "reference" if v == "standard" else "worse",
             "steps_to_standard": None, "p_one_sided_better": None if v == "standard" else 0.5}
            for v in variants]


def _render(width: int, summary, sweep=(), notes=()) -> list[str]:
    from rich.console import Console

    buf = io.StringIO()
    render_twin(Console(file=buf, width=width, no_color=True, color_system=None), summary, list(sweep), list(notes),
                [])
    return buf.getvalue().splitlines()


def test_80_columns_wrap_the_caption_and_the_lr_line_and_keep_a_fitting_table_whole():
    sweep = [{"variant": v, "lr": x, "val_loss": 1.6, "chosen": x == 1e-3}
             for v in ("standard", "share_qk", "share_qk_reformer", "symmetric") for x in (3e-4, 1e-3, 3e-3)]
    lines = _render(80, _summary(["standard", "share_qk"]), sweep, ["a note " * 20])
    assert max(len(x) for x in lines) <= 80
    assert any(x.startswith("learning rates") for x in lines)
    # a table 79 (and 80) characters wide at 80 columns: whole, no one-column continuation
    for target in (79, 80):
        name = "v"
        while True:
            wide = _render(200, _summary(["standard", name]))
            table = max(len(x) for x in wide[1:])
            if table >= target:
                break
            name += "v"
        assert table == target
        narrow = _render(80, _summary(["standard", name]))
        assert not any("continued" in x for x in narrow) and narrow[-4:] == wide[-4:]  # header, rule, two rows


def test_the_library_reports_progress_and_reads_short(tmp_path, small_text, capsys):
    class Receiver:
        def __init__(self):
            self.phases, self.ticks = [], []

        def phase(self, name, total, unit):
            self.phases.append((name, total, unit))

        def __call__(self, done, total, status=""):
            self.ticks.append((done, total, status))

    got = Receiver()
    lines = []
    result = qkinspect.twin(tmp_path / "out", text=small_text, variants="share_qk", seeds=2, steps=1, lr="1e-3,2e-3",
                            progress=got, notice=lines.append, **TINY)
    assert got.phases == [("lr sweep on seed 0", 4, "runs"), ("the other seeds at the chosen rates", 2, "runs")]
    assert [d for d, _, _ in got.ticks] == [1, 2, 3, 4, 1, 2]
    assert all("held-out loss" in s for _, _, s in got.ticks) and any("started" in x for x in lines)
    text = repr(result)
    assert len(text) < 300 and "\n" not in text and "6 runs" in text and "share_qk" in text
    # again, resumed: nothing to train; a plain callable gets (done, total) only and Lines prints nothing either
    calls = []
    qkinspect.twin(tmp_path / "out", text=small_text, variants="share_qk", seeds=2, steps=1, lr="1e-3,2e-3",
                   progress=lambda d, n: calls.append((d, n)), **TINY)
    assert calls == []
    qkinspect.twin(tmp_path / "more", text=small_text, variants="standard", seeds=1, steps=1, progress=Lines(),
                   **TINY)
    err = capsys.readouterr().err
    assert "twins: 1 runs\n" in err and "twins: 1/1 runs  [1/1] standard-s0-lr0.001: held-out loss" in err


def test_to_pandas_of_an_empty_kind_has_its_columns(tmp_path, small_text):
    pytest.importorskip("pandas")
    result = qkinspect.twin(tmp_path / "out", text=small_text, variants="standard", seeds=1, steps=1, **TINY)
    frame = result.to_pandas("trajectories")
    assert list(frame.columns) == ["variant", "seed", "lr", "step", "layer", "head", "metric", "value"]
    assert len(frame) == 0
    assert list(result.to_pandas("lr").columns) == ["variant", "lr", "val_loss", "chosen"]
    # what docs/notebook.md does with a twin
    assert list(result.to_pandas("summary")[["variant", "diff", "verdict"]].variant) == ["standard"]
    curves = result.to_pandas("runs").pivot_table(index="step", columns="variant", values="val_loss")
    assert list(curves.columns) == ["standard"] and list(curves.index) == [0, 1]


def test_trajectories_without_tracking_say_why_there_are_none(tmp_path):
    text = text_file(tmp_path / "t.txt", 2000)
    r = twin("--out", tmp_path / "out", "--text", text, *CLI_TINY, "--variants", "standard", "--rows",
             "trajectories", "-o", tmp_path / "t.csv")
    assert r.exit_code == 0 and "no trajectories to write" in r.stderr and "--track-every" in r.stderr
