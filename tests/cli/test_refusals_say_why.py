"""Issue 39: every refusal names the file and says why (never an empty `error:` line, never raw control characters
on the terminal), and a saved analysis whose numbers are beyond any metric's is refused where it enters, before an
atlas's statistics over it could overflow (no stray numpy warning)."""

from __future__ import annotations

import json
import warnings

import pytest

from qkinspect.errors import InputError
from tests.one_line import one_error_line


@pytest.mark.parametrize("text", [b"abc\x00def\n", b"\x00\x00\x00", b"# models\n./a\x00b\n", b"x\x1b[2Jy\n"])
def test_a_model_list_with_control_characters_is_refused(cli, tmp_path, text):
    listed = tmp_path / "models.txt"
    listed.write_bytes(text)
    line = one_error_line(cli("atlas", "--from", listed, "--out", tmp_path / "out"), str(listed), "control character")
    assert line.isprintable()
    assert not (tmp_path / "out").exists()


def test_a_refusal_without_a_message_still_says_something(cli, tmp_path, monkeypatch):
    import qkinspect.atlas.inputs as inputs

    def silent(*args, **kwargs):
        raise InputError()

    monkeypatch.setattr(inputs, "read_list", silent)
    listed = tmp_path / "models.txt"
    listed.write_text("demo\n")
    line = one_error_line(cli("atlas", "--from", listed, "--out", tmp_path / "out"))
    assert line != "error:" and "InputError" in line


def test_control_characters_in_any_message_are_shown_escaped(cli):
    line = one_error_line(cli("analyze", "a\x01b"))
    assert "a\\x01b" in line and line.isprintable()


@pytest.fixture(scope="module")
def saved(tiny_bert, tmp_path_factory):
    from typer.testing import CliRunner

    from qkinspect.cli.app import app

    path = tmp_path_factory.mktemp("saved") / "run.json"
    r = CliRunner().invoke(app, ["analyze", str(tiny_bert), "--metrics", "symmetry,norms", "--layer-form",
                                 "-o", str(path)])
    assert r.exit_code == 0, r.output
    return path


@pytest.mark.parametrize("value", [1.7e308, -1e308, 1e31])
def test_an_atlas_over_absurd_saved_values_is_one_error(cli, saved, tmp_path, value):
    doc = json.loads(saved.read_text())
    doc["heads"][1]["norm_q_fro"] = value
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy RuntimeWarning would fail the test
        r = cli("atlas", bad, "--out", tmp_path / "out", "-f", "csv")
    line = one_error_line(r, str(bad), "heads[1].norm_q_fro", "beyond any metric's value")
    assert "RuntimeWarning" not in r.stderr, line


def test_an_atlas_over_large_but_possible_values_is_quiet(cli, saved, tmp_path):
    doc = json.loads(saved.read_text())
    for i, h in enumerate(doc["heads"]):
        h["norm_q_fro"] = 1e30 if i % 2 else -1e30
    big = tmp_path / "big.json"
    big.write_text(json.dumps(doc))
    r = cli("atlas", big, "--out", tmp_path / "out", "-f", "csv")
    assert r.exit_code == 0, r.stderr
    assert "Warning" not in r.stderr and "warning" not in r.stderr
