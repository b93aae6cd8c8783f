"""`TextPages.table(keep=True)` (the twin report's Runs table): a table that fits on a page is not broken, and one
longer than a page leaves at least KEEP_ROWS rows on the page it continues on, under its repeated header (issue 44:
the Runs table broke with 2 rows carried over)."""

from __future__ import annotations

import pytest

from qkinspect.report.pages import KEEP_ROWS, LEADING, MARGIN, TABLE_SIZE, TextPages
from qkinspect.report.tables import Table


def laid_out(rows: int, free_rows: float, keep: bool) -> list[list[str]]:
    """The row labels on each page of a table of `rows` rows set after text that leaves about `free_rows` rows'
    height on the first page."""
    pages = []
    tp = TextPages(pages.append)
    tp.new_page()
    lh = TABLE_SIZE * LEADING / 72
    tp.y = MARGIN + 1.0 + lh * free_rows  # an inch for the table's title and header, about
    tp.table(Table("Runs", ["run", "loss"], [[f"r{i}", f"{i}.0"] for i in range(rows)]), keep=keep)
    tp.close()
    return [[t.get_text() for t in page.texts if t.get_text().startswith("r") and t.get_text()[1:].isdigit()]
            for page in pages]


@pytest.mark.parametrize("free", [0, 2, 6])
def test_a_table_that_fits_a_page_is_not_broken(free):
    pages = laid_out(12, free, keep=True)
    assert [p for p in pages if p] == [[f"r{i}" for i in range(12)]]
    broken = [p for p in laid_out(12, free, keep=False) if p]
    assert len(broken) == 2 and 0 < len(broken[0]) < 12  # without keep: broken where the page ends


def test_a_long_table_carries_at_least_keep_rows_under_its_header():
    full = [len(p) for p in laid_out(400, 20, keep=False) if p]
    first, page = full[0], full[1]  # rows on the first page, and on a whole continuation page
    for carried in range(1, KEEP_ROWS + 2):
        rows = first + page + carried
        assert [len(p) for p in laid_out(rows, 20, keep=False) if p][-1] == carried  # the widow without keep
        pages = [p for p in laid_out(rows, 20, keep=True) if p]
        assert all(len(p) >= KEEP_ROWS for p in pages), [len(p) for p in pages]
        assert [r for p in pages for r in p] == [f"r{i}" for i in range(rows)]  # in order, none lost
