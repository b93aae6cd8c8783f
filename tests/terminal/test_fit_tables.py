"""`fit_tables` at the boundary: a table exactly as wide as the terminal is one table; one column more splits it."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from qkinspect.terminal.tables import COLUMN_GAP, Column, fit_tables


def _columns(widths: list[int]) -> tuple[list[Column], list[Column]]:
    cols = [Column(chr(ord("a") + i) * w, ["1", "2"]) for i, w in enumerate(widths)]
    return cols[:1], cols[1:]


def _printed(tables: list, width: int) -> list[str]:
    buf = io.StringIO()
    console = Console(file=buf, width=width, no_color=True)
    for t in tables:
        console.print(t)
    return buf.getvalue().splitlines()


@pytest.mark.parametrize("widths", [[5, 8, 10, 3], [2, 3, 4], [7, 12, 1, 1, 30], [3, 9, 1]])
def test_a_table_exactly_as_wide_as_the_terminal_stays_whole(widths):
    labels, values = _columns(widths)
    table_width = sum(widths) + COLUMN_GAP * (len(widths) - 1)  # a gap between columns, none after the last
    whole = fit_tables(labels, values, width=table_width)
    assert len(whole) == 1
    lines = _printed(whole, table_width)
    assert max(len(line) for line in lines) == table_width  # it is exactly that wide, nothing wrapped or cut
    assert lines[0].split() == [c.header for c in (*labels, *values)]
    assert len(fit_tables(labels, values, width=table_width + 1)) == 1
    split = fit_tables(labels, values, width=table_width - 1)
    assert len(split) == 2
    lines = _printed(split, table_width - 1)
    assert max(len(line) for line in lines) <= table_width - 1
    assert "continued" in lines and lines[-4].split() == [labels[0].header, values[-1].header]


def test_columns_that_do_not_fit_at_all_each_get_a_table():
    labels, values = _columns([4, 20, 20])
    tables = fit_tables(labels, values, width=10)  # no value column fits beside the labels: one each, whole
    assert len(tables) == 2
    assert all(len(line) <= 4 + COLUMN_GAP + 20 for line in _printed(tables, 80))
