"""A misspelt name is refused with the closest known ones: metrics, groups, --metric, --format, --kind, edits,
blocks (one error line, exit 2, before any model is read where the name alone decides)."""

from __future__ import annotations

import pytest

from qkinspect.suggest import did_you_mean


@pytest.mark.parametrize("args, hint", [
    (["analyze", "--metrics", "symetry"], "did you mean symmetry"),
    (["analyze", "--metrics", "symmetry,overlapp"], "did you mean overlap"),
    (["analyze", "--format", "jsn"], "did you mean json"),
    (["plot", "--kind", "spectrum", "-o", "x.png"], "did you mean spectra"),
    (["plot", "--kind", "metric", "--metric", "shared_qk_dist", "-o", "x.png"], "did you mean shared_qk_distance"),
    (["experiment", "--edit", "symetric"], "did you mean symmetric"),
    (["analyze", "--block", "encodr"], "did you mean encoder"),
])
def test_a_misspelt_name_gets_a_suggestion(cli, tmp_path, monkeypatch, args, hint):
    monkeypatch.chdir(tmp_path)
    r = cli(*args)
    assert r.exit_code == 2 and r.stdout == ""
    lines = [line for line in r.stderr.splitlines() if not line.startswith("note:")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and hint in lines[0], lines


def test_nothing_close_suggests_nothing(cli):
    r = cli("analyze", "--metrics", "qqqqq")
    assert r.exit_code == 2 and "did you mean" not in r.stderr and "unknown metric 'qqqqq'" in r.stderr


def test_did_you_mean():
    assert did_you_mean("symetry", ["symmetry", "overlap"]) == " (did you mean symmetry?)"
    assert did_you_mean("Symmetry ", ["symmetry"]) == " (did you mean symmetry?)"
    assert did_you_mean("zzz", ["symmetry"]) == ""
    assert did_you_mean("share_q", ["share_qk", "share_qkv", "share_qk"]) == " (did you mean share_qk or share_qkv?)"
