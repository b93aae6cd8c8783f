"""Results in a notebook: a result that is a cell's value shows itself as the tables `qkinspect` prints in a
terminal, and `to_pandas()` makes it one DataFrame (docs/notebook.md).

The pieces every result uses (the analysis, experiment, sweep and atlas results):
- `html_table(render)`: the HTML of what `render(console)` prints (qkinspect.terminal's rich tables, the ones the
  CLI prints, colours kept), for a result's `_repr_html_`;
- `data_frame(rows)`: tidy rows (the CSV rows of the result) as a pandas DataFrame; pandas is imported here, and a
  clear error says how to install it where it is missing;
- `Tabular`: a mixin giving `_repr_html_`, `to_pandas()` and `save(path)` to a result that has `table_rows()`,
  `render_table(console)` and `document()` (the JSON its command's `-o FILE.json` writes); `save` follows the
  extension as `-o` does (qkinspect.formats).

Example:
    >>> r = qkinspect.analyze()  # doctest: +SKIP
    >>> r  # in Jupyter: the per-head and per-layer tables  # doctest: +SKIP
    >>> r.to_pandas().groupby("layer")["symmetry"].median()  # doctest: +SKIP
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any

NOTEBOOK_WIDTH = 100  # columns a notebook's output area shows in its default font
_PRE = ('<pre style="white-space:pre;overflow-x:auto;line-height:1.25;'
        "font-family:Menlo,'DejaVu Sans Mono',consolas,'Courier New',monospace\">{code}</pre>")


def html_table(render: Callable[[Any], None], width: int = NOTEBOOK_WIDTH) -> str:
    """The HTML fragment (one <pre>, inline colours) of what `render(console)` prints on a `width`-column
    terminal."""
    from rich.console import Console

    console = Console(record=True, file=io.StringIO(), width=width, force_terminal=True, color_system="standard",
                      force_jupyter=False)
    render(console)
    return console.export_html(inline_styles=True, code_format=_PRE)


def data_frame(rows: Sequence[dict[str, Any]], what: str = "to_pandas()", columns: Sequence[str] = ()):
    """`rows` as a pandas DataFrame, one row per record, the columns in the order the rows first name them
    (`columns` first: a kind of record with no rows is a frame of its columns and no rows)."""
    try:
        import pandas as pd
    except ImportError:
        raise ImportError(f"{what} needs pandas: pip install pandas") from None
    columns = list(dict.fromkeys([*columns, *(k for r in rows for k in r)]))
    return pd.DataFrame(list(rows), columns=columns)


class Tabular:
    """Mixin for a result with `table_rows()` (its CSV rows) and `render_table(console)` (its terminal table):
    shown as that table in a notebook, one DataFrame of those rows with `to_pandas()`, and `save(path)` writes
    what the command's `-o path` writes (`document()` as JSON, the rows as CSV ...). The renderer must not
    import the result's module back (the records sit below qkinspect.terminal's tables)."""

    def table_rows(self) -> list[dict[str, Any]]:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def render_table(self, console) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def document(self) -> dict[str, Any]:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def _repr_html_(self) -> str:
        return html_table(self.render_table)

    def to_pandas(self):
        """The result's tidy rows (those of its CSV) as a pandas DataFrame (needs pandas)."""
        return data_frame(self.table_rows())

    PARQUET = False  # whether the result's command writes -o FILE.parquet

    def parquet_data(self) -> list[dict[str, Any]] | dict[str, Any]:
        """What `save("x.parquet")` writes: the table's rows (or, where a result overrides it, its columns)."""
        return self.table_rows()

    def save(self, path):
        """Write the result to `path` (atomically) as its command's `-o path` writes it, byte for byte, in the
        format the extension names: `.json` the whole document (what `plot` and `report` read back), `.csv`,
        `.ndjson`/`.jsonl` the table's rows, `.txt` the table, `.parquet` the rows where the command writes
        Parquet (needs pyarrow). Returns the path.

        Raises:
            InputError: an extension that names no format (naming the path), or Parquet without pyarrow.
            OutputError: the file cannot be written.
        """
        from qkinspect.formats import save_result

        return save_result(path, document=self.document, rows=self.table_rows, render=self.render_table,
                           parquet=self.parquet_data if self.PARQUET else None)
