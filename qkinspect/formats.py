"""The file formats of a result, one set for a command's `-o FILE` (qkinspect.cli.output) and a result's
`save(path)`: the extension decides (`.json` the whole document, `.ndjson`/`.jsonl` and `.csv` the tidy rows,
`.txt` the table, `.parquet` the rows where the command writes Parquet); any other is refused, naming the path.

Example:
    >>> save_result("runs.csv", document=result.document, rows=result.table_rows,  # doctest: +SKIP
    ...             render=result.render_table)
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from qkinspect.documents import json_safe
from qkinspect.errors import InputError

EXTENSIONS = {".json": "json", ".ndjson": "ndjson", ".jsonl": "ndjson", ".csv": "csv", ".txt": "table"}
PARQUET = {".parquet": "parquet"}
TABLE_FILE_WIDTH = 160  # a table written to a file has no terminal to take its width from ($COLUMNS, if set, wins)


def format_of(path: str | Path, parquet: bool, what: str = "path") -> str:
    """The format `path`'s extension names (`-`: JSON to stdout); InputError naming `what` and the path for any
    other (`.parquet` only where `parquet`)."""
    from qkinspect.files import STDOUT

    if str(path) == STDOUT:
        return "json"
    known = {**EXTENSIONS, **(PARQUET if parquet else {})}
    ext = Path(path).suffix.lower()
    if ext not in known:
        raise InputError(f"{what}={str(path)!r}: cannot tell the format from {ext or 'no extension'!r}; "
                         f"name the file with one of {', '.join(known)}")
    return known[ext]


def save_result(path: str | Path, *, document: Callable[[], dict[str, Any]],
                rows: Callable[[], Iterable[dict[str, Any]]], render: Callable[[Any], None],
                parquet: Callable[[], list[dict[str, Any]] | dict[str, Any]] | None = None) -> Path:
    """Write a result to `path` (atomically) in the format its extension names, as its command's `-o` writes it
    byte for byte: `document()` as JSON, `rows()` as NDJSON or CSV, `render(console)` as the plain-text table,
    `parquet()` (rows or columns; None: the command writes no Parquet) as Parquet. Returns the path.

    Raises:
        InputError: an extension that names none of these, or Parquet without pyarrow.
        OutputError: the file cannot be written.
    """
    from qkinspect.files import atomic_write, atomic_write_file, check_writable, save_json

    name = format_of(path, parquet is not None)
    path = Path(path)
    if name == "json":
        return save_json(document(), path)
    if name == "parquet":
        if not _has_pyarrow():
            raise InputError(f"path={str(path)!r}: Parquet needs pyarrow: pip install pyarrow")
        check_writable(path)
        data = parquet()  # type: ignore[misc]  # parquet is not None: format_of named Parquet
        atomic_write_file(path, lambda tmp: parquet_file(data, tmp))
        return path
    if name == "ndjson":
        atomic_write(path, lambda f: write_ndjson(rows(), f))
    elif name == "csv":
        atomic_write(path, lambda f: write_csv(list(rows()), f))
    else:
        atomic_write(path, lambda f: write_table(render, document, f, terminal=False))
    return path


def _has_pyarrow() -> bool:
    import importlib.util

    return importlib.util.find_spec("pyarrow") is not None


def parquet_file(data: list[dict[str, Any]] | dict[str, Any], target: Path) -> None:
    """Rows (a list of dicts) or columns (name -> array) as a Parquet file at `target` (not atomic: callers write a
    temporary file through `qkinspect.files.atomic_write_file`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(data) if isinstance(data, list) else pa.table(data)
    pq.write_table(table, target)


def write_ndjson(rows: Iterable[dict[str, Any]], f: IO[str]) -> None:
    for row in rows:
        f.write(json.dumps(json_safe(row), allow_nan=False, separators=(",", ":")))
        f.write("\n")


def write_csv(rows: list[dict[str, Any]], f: IO[str]) -> None:
    """A header, then one row per record; missing or NaN values are empty cells."""
    fields = list(dict.fromkeys(k for row in rows for k in row))
    w = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    for row in rows:
        w.writerow({k: _csv_cell(v) for k, v in json_safe(row).items()})


def _csv_cell(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return v


def write_table(render: Callable[[Any], None] | None, document: Callable[[], dict[str, Any]], f: IO[str], *,
                terminal: bool, width: int = TABLE_FILE_WIDTH) -> None:
    """`render(console)` on `f`: a terminal's own console, else plain text `width` columns wide ($COLUMNS, when
    set and at least 40, wins); the document as JSON where there is no renderer."""
    from rich.console import Console

    if terminal:
        console = Console(file=f)
    else:
        columns = os.environ.get("COLUMNS", "")
        width = int(columns) if columns.isdigit() and int(columns) >= 40 else width
        console = Console(file=f, width=width, no_color=True, force_terminal=False, color_system=None)
    if render is None:
        console.print_json(data=json_safe(document()))
    else:
        render(console)
