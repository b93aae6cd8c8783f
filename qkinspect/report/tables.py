"""The titled table of strings every report subject lays out on its pages (`qkinspect.report.pages`, the HTML
report): the analysis' per-layer tables (`qkinspect.report.analysis.tables`), the experiment's, the sweep's and
the composition's."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Table:
    """A titled table of strings: `header` names the columns, `rows` are already formatted."""

    title: str
    header: list[str]
    rows: list[list[str]]

    def split(self, max_columns: int) -> list[Table]:
        """Split wide tables into several (each repeating the first column) to fit a page."""
        if len(self.header) <= max_columns:
            return [self]
        width = max_columns - 1
        out = []
        for i, start in enumerate(range(1, len(self.header), width)):
            cols = [0, *range(start, min(start + width, len(self.header)))]
            out.append(Table(self.title + (f" (continued, {i + 1})" if i else ""),
                             [self.header[c] for c in cols], [[r[c] for c in cols] for r in self.rows]))
        return out
