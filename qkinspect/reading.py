"""Reading the text and JSON files qkinspect is given, bounded: regular files only, at most a fixed number of bytes.

Every text or JSON file the tool reads (`--text`, a runs.json, a sweep's manifest and result files, a checkpoint's
config and index) goes through `read_bytes`, which

- opens without blocking (``O_NONBLOCK``: a FIFO with no writer does not hang the open) and refuses anything that
  is not a regular file after links (a FIFO, a character device such as ``/dev/zero``, a socket, a folder), with
  one line naming the file;
- reads at most `limit` bytes: a larger file is refused (`InputError`), or, with ``prefix=True``, only its first
  `limit` bytes are read (``--text`` needs only as much text as ``--tokens`` asks for).

`read_json` adds a nesting bound, checked without recursion, so a deeply nested document is refused with one line
instead of a RecursionError.

Example:
    >>> doc = read_json(Path("runs.json"), what="an experiment document")  # doctest: +SKIP
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

from qkinspect.errors import InputError

MAX_JSON_BYTES = 64 << 20  # a JSON document qkinspect reads (runs.json, sweep results and manifest)
MAX_TEXT_BYTES = 64 << 20  # the most of a --text file read, whatever --tokens asks for
MAX_DEPTH = 64  # nesting a JSON document may have (qkinspect's own have 5 or 6 levels)
_CHUNK = 1 << 20


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def os_reason(e: OSError) -> str:
    """The plain reason for an OSError: "Permission denied", "No such file or directory", "is a folder" ..."""
    if isinstance(e, IsADirectoryError) or e.errno == errno.EISDIR:
        return "is a folder, not a file"
    return e.strerror or str(e) or type(e).__name__


def _as(what: str) -> str:
    return "" if what == "file" else f" as {what}"


def _a(what: str) -> str:
    return "a file" if what == "file" else what


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


def read_bytes(path: str | Path, *, limit: int, what: str = "file", prefix: bool = False,
               error: type[InputError] = InputError) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them.

    Raises `error` (an InputError subclass) naming the file when it is missing or unreadable, not a regular file
    (after links), or, unless `prefix`, larger than `limit` bytes.
    """
    p = Path(path)
    try:
        before = os.stat(p)  # look before opening: a device is never opened at all
        if not stat.S_ISREG(before.st_mode):
            raise error(f"{p}: is {_kind(before.st_mode)}, not a regular file; refused{_as(what)}")
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise _unreadable(p, e, what, error) from None
    try:
        st = os.fstat(fd)  # what was opened (it may have been swapped since the stat above)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{p}: is {_kind(st.st_mode)}, not a regular file; refused{_as(what)}")
        if st.st_size > limit and not prefix:
            raise error(f"{p}: {st.st_size} bytes, more than the {_mib(limit)} {_a(what)} may have; refused")
        chunks, n = [], 0
        while n <= limit:  # one byte past the limit tells a file that grew while being read
            chunk = os.read(fd, min(_CHUNK, limit + 1 - n))
            if not chunk:
                break
            chunks.append(chunk)
            n += len(chunk)
    except OSError as e:
        raise _unreadable(p, e, what, error) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        if not prefix:
            raise error(f"{p}: more than the {_mib(limit)} {_a(what)} may have; refused")
        data = data[:limit]
    return data


def _unreadable(p: Path, e: OSError, what: str, error: type[InputError]) -> InputError:
    """"runs.json: cannot read an experiment document (no such file)"; for a plain "file", as the checkpoint
    readers say it: "config.json: file is missing", "config.json: cannot read it (Permission denied)"."""
    if what != "file":
        reason = "no such file" if isinstance(e, FileNotFoundError) else os_reason(e)
        return error(f"{p}: cannot read {what} ({reason})")
    if isinstance(e, FileNotFoundError):
        return error(f"{p}: file is missing")
    return error(f"{p}: cannot read it ({os_reason(e)})")


def read_text(path: str | Path, *, limit: int, what: str = "file", prefix: bool = False,
              error: type[InputError] = InputError) -> str:
    """`read_bytes` decoded as UTF-8; with `prefix`, a character cut by the limit is dropped."""
    data = read_bytes(path, limit=limit, what=what, prefix=prefix, error=error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        if prefix and len(data) == limit and e.start >= len(data) - 3 and e.reason == "unexpected end of data":
            return data[: e.start].decode("utf-8")
        raise error(f"{path}: {what} is not UTF-8 text (at byte {e.start})") from None


def read_json(path: str | Path, *, what: str = "file", limit: int = MAX_JSON_BYTES, max_depth: int = MAX_DEPTH,
              error: type[InputError] = InputError) -> Any:
    """A JSON value from the regular file `path` (at most `limit` bytes, nested at most `max_depth` levels);
    `error` naming the file when it cannot be read or is not such JSON. NaN and infinities are refused too
    (qkinspect never writes them: missing values are null)."""
    text = read_text(path, limit=limit, what=what, error=error)
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise error(f"{path}: {what} is nested more than {max_depth} levels deep") from None
    except ValueError as e:
        raise error(f"{path}: {what} is not valid JSON ({e})") from None
    if depth(data, max_depth) > max_depth:
        raise error(f"{path}: {what} is nested more than {max_depth} levels deep")
    return data


def declares_kind(spec: object, kind: str, limit: int = 4096) -> bool:
    """Whether the model argument `spec` names a .json file whose first `limit` bytes say `"kind": "<kind>"` (read
    no further): a saved document's predicate, "is it one of mine", asked of any model argument for free."""
    if not isinstance(spec, (str, Path)):
        return False
    path = Path(spec)
    if path.suffix.lower() != ".json":
        return False
    try:
        head = read_bytes(path, limit=limit, prefix=True)
    except InputError:
        return False
    return f'"kind": "{kind}"'.encode() in head or f'"kind":"{kind}"'.encode() in head


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def depth(x: Any, stop: int = MAX_DEPTH) -> int:
    """Nesting depth of parsed JSON, without recursion (counting stops past `stop`)."""
    deepest, stack = 0, [(x, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > stop:
            break
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((c, d + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


__all__ = ["MAX_DEPTH", "MAX_JSON_BYTES", "MAX_TEXT_BYTES", "declares_kind", "depth", "os_reason", "read_bytes",
           "read_json", "read_text"]
