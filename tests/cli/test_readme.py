"""The README's Usage section documents every command, and its pasted output is what the tool prints today."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def _usage() -> str:
    text = README.read_text()
    assert "## Usage" in text and "## Pointing at a model" in text
    return text.split("## Usage", 1)[1]


@pytest.mark.parametrize("command", ["info", "analyze", "spectrum", "compare", "extract"])
def test_a_subsection_per_command(command):
    assert f"### `qkinspect {command}`" in _usage()


def test_pasted_csv_is_current_output(cli):
    block = re.search(r"\$ (qkinspect analyze [^\n]*--format csv)\n(.*?)\n```", _usage(), flags=re.S)
    args = block.group(1).split()[1:]
    pasted = list(csv.DictReader(io.StringIO(block.group(2))))
    now = list(csv.DictReader(io.StringIO(cli(*args).stdout)))
    assert [r.keys() for r in now] == [r.keys() for r in pasted] and len(now) == 3
    for a, b in zip(now, pasted, strict=True):
        assert float(a["symmetry"]) == pytest.approx(float(b["symmetry"]), abs=1e-6)
        assert (a["layer"], a["head"]) == (b["layer"], b["head"])
