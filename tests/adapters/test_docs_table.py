"""docs/architectures.md has a table row for every model_type the registry supports, and no row for one it does
not (a row is the proof's summary: a family without one is undocumented, a row without an adapter is wrong)."""

from __future__ import annotations

from pathlib import Path

from qkinspect.loading import supported_model_types

DOC = Path(__file__).resolve().parents[2] / "docs" / "architectures.md"


def documented_model_types() -> set[str]:
    types: set[str] = set()
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| ") or len(cells) < 8 or cells[0] in ("model_type", "---"):
            continue
        types.update(t.strip() for t in cells[0].split(","))
    return types


def test_every_supported_model_type_has_a_row():
    documented = documented_model_types()
    assert set(supported_model_types()) - documented == set()
    assert documented - set(supported_model_types()) == set()
