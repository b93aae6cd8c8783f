"""A sweep's table is analyze's: a row per checkpoint, step, block, layer and head (per layer with --by layer), as
the help says, every number and header whole at 80 columns (no '…'), columns that do not fit in a further table."""

from __future__ import annotations

import io
import itertools
import re

import pytest
from rich.console import Console

from qkinspect.cli.commands.sweep import sweep_document
from qkinspect.sweep.store import SweepResult

METRICS = ("symmetry", "directionality", "qk_effective_rank", "qk_stable_rank", "overlap_qk", "overlap_qv",
           "overlap_kv", "ov_copying")


class FakeFolder:
    """The part of a sweep folder sweep_document reads."""

    def __init__(self, rows):
        self._rows, self.folder, self.options, self.checkpoints, self.failures = rows, "sweep", {}, [], []

    def rows(self, by="head"):
        return self._rows

    document = SweepResult.document  # the folder's own document, over these rows


def head_rows(names, layers=2, heads=3):
    rows = []
    for step, (name, layer, head) in enumerate(itertools.product(names, range(layers), range(heads))):
        values = {m: (-1) ** step * (0.0123 + step) * (30.6 if "rank" in m else 1.0) for m in METRICS}
        rows.append({"checkpoint": name, "step": 500 * (names.index(name) + 1), "block": "encoder", "layer": layer,
                     "head": head, "kv_head": head, "rank_q": 8, "rank_k": 8, "rank_v": 8, **values})
    return rows


def render(rows, width, by="head", requested=None) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, legacy_windows=False)
    sweep_document(FakeFolder(rows), by=by, requested=requested).render(console)
    return out.getvalue()


@pytest.mark.parametrize("names", [["checkpoint-500", "checkpoint-1000"],
                                   ["runs/a-very-long-run-name/checkpoint-500", "runs/a-very-long-run-name/ckpt-1000"]])
@pytest.mark.parametrize("width", [80, 120])
def test_a_row_per_head_nothing_cut(names, width):
    rows = head_rows(names)
    text = render(rows, width)
    assert "…" not in text and max(map(len, text.splitlines())) <= width
    for row in rows:  # every head's row is there, with its numbers whole
        sym = f"{row['symmetry']:.3f}"
        assert re.search(rf"\b{row['layer']}\s+{row['head']}\s+{re.escape(sym)}\b", text), (row, text)
    for header in ("step", "layer", "head", "sym", "erank", "ovl_qk", "ov_copy"):
        assert re.search(rf"(^|\s){header}(\s|$)", text, re.M), header
    if len(names[0]) > width // 4:
        assert "checkpoints: 1=runs/a-very-long-run-name/checkpoint-500" in " ".join(text.split())


def test_by_layer_rows():
    rows = [{"checkpoint": "c", "step": s, "block": "encoder", "layer": layer, "n_heads": 12,
             "symmetry_median": 0.1 * s, "symmetry_mean": 0.2} for s in (1, 2) for layer in range(3)]
    text = render(rows, 80, by="layer")
    assert "…" not in text and "sym_med" in text and "heads" in text
    assert len(re.findall(r"^\s*c\s+\d\s+\d\s+12\s", text, re.M)) == 6
