"""Issue 25, class 11: `plot -o x.pdf` and `report -o x.pdf` on a full file system. matplotlib's PDF writer, writing
to a full disk, raised AttributeError or a zlib error (exit 1); figures and reports are now rendered into memory and
written by qkinspect itself, so a full disk is one `error:` line naming the file, exit 2, and no file is left."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import subprocess
from pathlib import Path

import pytest

import qkinspect.files
from tests.one_line import one_error_line


class _FullDisk(io.RawIOBase):
    """A binary file that takes `room` bytes, then fails as a full disk does."""

    def __init__(self, room: int):
        self.room = room

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        n = len(data)
        if n > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= n
        return n


@pytest.fixture
def full_disk(monkeypatch):
    """Every file qkinspect.files opens for writing takes 1000 bytes, then reports ENOSPC (the file is created
    for real, so that its removal can be checked)."""
    real_open = open

    def fake_open(file, mode="r", *args, **kwargs):
        if "w" not in mode:
            return real_open(file, mode, *args, **kwargs)
        real_open(file, mode).close()
        raw = _FullDisk(1000)
        return io.BufferedWriter(raw) if "b" in mode else io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8")

    monkeypatch.setattr(qkinspect.files, "open", fake_open, raising=False)


@pytest.mark.parametrize("name", ["x.pdf", "x.png", "x.svg"])
def test_plot_on_a_full_disk(cli, tiny_bert, tmp_path, full_disk, name):
    out = tmp_path / name
    line = one_error_line(cli("plot", tiny_bert, "--kind", "overlap", "-o", out))
    assert line == f"error: {out}: cannot write (No space left on device)"
    assert list(tmp_path.iterdir()) == []


def test_report_on_a_full_disk(cli, tiny_bert, tmp_path, full_disk):
    out = tmp_path / "r.pdf"
    out.write_bytes(b"the old report")
    line = one_error_line(cli("report", tiny_bert, "-o", out))
    assert line == f"error: {out}: cannot write (No space left on device)"
    assert [p.name for p in tmp_path.iterdir()] == ["r.pdf"] and out.read_bytes() == b"the old report"


def test_write_rendered_passes_what_the_renderer_returns(tmp_path):
    out = tmp_path / "a.bin"
    assert qkinspect.files.write_rendered(out, lambda f: f.write(b"abc") and 7) == 7
    assert out.read_bytes() == b"abc"


@contextlib.contextmanager
def tiny_tmpfs(folder: Path, kib: int = 64):
    """A real, tiny file system (tmpfs); skips where mounting is not allowed (not root, a container)."""
    folder.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(folder)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode(errors='replace').strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True)


@pytest.mark.parametrize("fill", [50, 60])
def test_a_real_full_file_system(cli, tiny_bert, tmp_path, fill):
    """plot and report on a 64 KiB tmpfs already holding `fill` KiB: whatever fits is written whole, whatever
    does not is one line, exit 2, and nothing partial (matplotlib's writer used to fail here with exit 1)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    with tiny_tmpfs(tmp_path / "disk") as disk:
        (disk / "fill").write_bytes(b"\0" * (fill << 10))
        for args, out in ((["plot", tiny_bert, "--kind", "overlap"], disk / "x.pdf"),
                          (["report", tiny_bert], disk / "r.pdf")):
            r = cli(*args, "-o", out)
            if r.exit_code == 0:
                assert out.read_bytes()[:5] == b"%PDF-" and out.read_bytes().rstrip().endswith(b"%%EOF")
            else:
                assert one_error_line(r) == f"error: {out}: cannot write (No space left on device)"
                assert not out.exists()
            assert not [p.name for p in disk.iterdir() if p.name.endswith(".tmp")]
        assert not (disk / "r.pdf").exists()  # a report does not fit in 64 KiB at all
