"""Writing what -o names: atomically for a file, straight through for a stream, never replacing a link or a device.

What `-o PATH` names decides how it is written:

- a regular file, or a new path: a temporary file ``.NAME.xxxx.tmp`` in the same folder, then `os.replace`, so a
  reader never sees a partial file and a failed or interrupted run leaves the old file as it was;
- a symbolic link: the same, beside the link's final target, which is replaced; the link stays a link;
- a FIFO, a character device (``/dev/stdout``, ``/dev/null``) or a socket, and ``-`` (stdout): written straight to,
  since renaming over them would replace the node. Writers that need a file name (safetensors, Parquet) write
  a temporary file in the system's temporary folder first and copy it through.

Figures and PDF reports are rendered into memory first (`write_rendered`), so that a full disk is an OSError of
the write here (one line, exit 2), not an error inside matplotlib's writers.

SIGTERM and SIGHUP during a write remove the temporary file before the process ends (SIGINT already raises
KeyboardInterrupt); the process then ends as the signal would have ended it.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

from qkinspect.errors import OutputError

STDOUT = "-"
T = TypeVar("T")


class Terminated(SystemExit):
    """SIGTERM or SIGHUP arrived while a file was being written; raised so that clean-up code runs.

    A SystemExit: uncaught, the process ends quietly with status 128 + the signal's number; the CLI re-raises the
    signal itself once the temporary file is gone.
    """

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


def is_stream(path: Path) -> bool:
    """`-`, or an existing FIFO, character device or socket (after links): written straight to, never renamed."""
    if str(path) == STDOUT:
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode)


def target_of(path: Path) -> Path:
    """The file a write to `path` replaces: `path` itself, or the final target of a link (which may not exist)."""
    return Path(os.path.realpath(path)) if os.path.islink(path) else path


def check_writable(path: Path) -> None:
    """Fail early, with one clear line, when `path` cannot be written (missing folder, no permission, a folder)."""
    if str(path) == STDOUT:
        return
    if is_stream(path):
        if not os.access(path, os.W_OK):
            raise OutputError(f"{path}: cannot write to it (Permission denied)")
        return
    target = target_of(path)
    shown = path if target == path else f"{path} (a link to {target})"
    folder = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise OutputError(f"{shown}: is a folder, not a file")
    if target.exists() and not target.is_file():
        raise OutputError(f"{shown}: is not a regular file, a FIFO or a character device; refused")
    if not folder.is_dir():
        raise OutputError(f"{shown}: {folder} " + ("is not a folder" if folder.exists() else "does not exist"))
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"{shown}: folder {folder} is not writable (Permission denied)")
    if target.exists() and not os.access(target, os.W_OK):
        raise OutputError(f"{shown}: file is not writable (Permission denied)")


def write_json(doc: Any, f: IO[str]) -> None:
    """The one JSON layout of the documents qkinspect writes: indented by 2, no NaN (null instead, made by the
    caller), a final newline. `doc` must already be JSON-safe (numbers, strings, lists, dicts)."""
    import json

    json.dump(doc, f, indent=2, allow_nan=False)
    f.write("\n")


def save_json(doc: Any, path: str | Path) -> Path:
    """Write the JSON document `doc` to `path` (atomically, NaN as null, the one layout of `write_json`): what a
    command's `-o FILE.json` writes, and every result's `save(path)`. Returns the path."""
    from qkinspect.documents import json_safe

    path = Path(path)
    safe = json_safe(doc)
    atomic_write(path, lambda f: write_json(safe, f))
    return path


def atomic_write(path: Path, write: Callable[[IO], None], *, binary: bool = False) -> None:
    """Call `write(f)` for `path`: on a temporary file renamed over a regular file (on any failure, including
    KeyboardInterrupt and SIGTERM, the temporary file is removed and `path` left untouched), or straight on a
    stream (`-`, FIFO, character device)."""
    path = Path(path)
    text = {} if binary else {"encoding": "utf-8", "newline": ""}
    if str(path) == STDOUT:
        out = sys.stdout.buffer if binary else sys.stdout
        write(out)
        out.flush()
        return
    if is_stream(path):
        check_writable(path)
        with _os_errors(path), open(path, "wb" if binary else "w", **text) as f:
            write(f)
        return

    def produce(tmp: Path) -> None:
        with open(tmp, "wb" if binary else "w", **text) as f:
            write(f)

    atomic_write_file(path, produce)


def atomic_write_file(path: Path, produce: Callable[[Path], None]) -> None:
    """Like `atomic_write` for writers that need a file name (e.g. safetensors' save_file): `produce(tmp_path)`.

    For a stream the file is produced in the temporary folder and then copied through."""
    path = Path(path)
    check_writable(path)
    stream = is_stream(path)
    target = target_of(path)
    folder = None if stream else (target.parent if str(target.parent) else Path("."))
    with _removing_on_signals():
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
        except OSError as e:
            raise OutputError(f"{path}: cannot create a file there ({e.strerror or e})") from None
        os.close(fd)
        try:
            produce(Path(tmp))
            if stream:
                _copy_to_stream(Path(tmp), path)
                _remove(tmp)
            else:
                os.chmod(tmp, _mode_for(target))
                os.replace(tmp, target)
        except OSError as e:
            _remove(tmp)
            raise OutputError(f"{path}: cannot write ({e.strerror or e})") from None
        except BaseException:
            _remove(tmp)
            raise


def write_rendered(path: Path, render: Callable[[IO[bytes]], T]) -> T:
    """`render(buffer)` into memory, then its bytes written to `path` as `atomic_write` writes; returns what
    `render` returned.

    For writers that are not ours (matplotlib's PDF, PNG and SVG writers): they never touch the file system, so a
    full disk or an I/O error is an OSError of this module's own write (OutputError, one line naming the file, no
    partial or temporary file left), never an error inside the writer (matplotlib's PDF backend, writing to a full
    disk, raises AttributeError or a zlib error, not OSError). A figure or report fits in memory many times over.
    """
    buffer = io.BytesIO()
    value = render(buffer)
    data = buffer.getvalue()
    atomic_write(Path(path), lambda f: f.write(data), binary=True)
    return value


def _copy_to_stream(tmp: Path, path: Path) -> None:
    with open(tmp, "rb") as src:
        if str(path) == STDOUT:
            sys.stdout.flush()
            shutil.copyfileobj(src, sys.stdout.buffer)
            sys.stdout.buffer.flush()
        else:
            with open(path, "wb") as dst:
                shutil.copyfileobj(src, dst)


def _mode_for(target: Path) -> int:
    """An existing file keeps its permissions; a new one gets the usual 0666 less the umask."""
    with contextlib.suppress(OSError):
        return stat.S_IMODE(os.stat(target).st_mode)
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def _os_errors(path: Path) -> Iterator[None]:
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as e:
        raise OutputError(f"{path}: cannot write ({e.strerror or e})") from None


@contextlib.contextmanager
def _removing_on_signals() -> Iterator[None]:
    """While a temporary file exists, SIGTERM and SIGHUP raise `Terminated` (so `finally`/`except` clean-up runs)
    instead of ending the process at once. Only in the main thread, and only where the signal has its default
    action (an application that installed its own handler keeps it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None and signal.getsignal(sig) == signal.SIG_DFL:
            previous[sig] = signal.signal(sig, _raise_terminated)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated(signum)


def _remove(tmp: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(tmp)


__all__ = ["atomic_write", "atomic_write_file", "check_writable", "is_stream", "target_of", "write_rendered",
           "Terminated", "STDOUT"]
