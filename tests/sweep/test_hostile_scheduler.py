"""Issue 25, class 7: `--scheduler` that is not a Dask scheduler. Real listeners on 127.0.0.1 misbehave each way
(silence, an HTTP reply, a short frame, garbage, a closed connection); each must end in one `error:` line, exit 2,
in bounded time, before a Dask client is made. Addresses with other schemes or no port are refused unread."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qkinspect.cli.app import app
from qkinspect.errors import InputError
from tests.sweep.conftest import NEEDS_DASK

pytest.importorskip("distributed", reason=NEEDS_DASK)

from qkinspect.sweep import scheduler  # noqa: E402 - needs distributed
from tests.one_line import one_error_line

REPLIES = {
    "silent": None,  # accepts, reads, never answers
    "http": b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    "short frame": struct.pack("<Q", 4) + b"abcd",  # a Dask frame too short for its own header (struct.error)
    "garbage": struct.pack("<Q", 24) + struct.pack("<QQ", 1, 8) + b"\xc1" * 8,  # msgpack cannot read it
    "closes": b"",  # accepts and hangs up at once
    "huge length": struct.pack("<Q", 2**62),  # asks the reader for 4 EiB
}


@contextlib.contextmanager
def listener(reply: bytes | None, close: bool | None = None):
    """A TCP server on 127.0.0.1 answering every connection with `reply` (None: never a byte), then hanging up when
    `close` (default: only for an empty reply); yields the port."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    conns: list[socket.socket] = []
    stop = threading.Event()

    srv.settimeout(0.1)  # so that the thread sees `stop` (closing a socket does not wake accept())

    def serve() -> None:
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            c.settimeout(None)
            conns.append(c)
            if reply is not None:
                with contextlib.suppress(OSError):
                    c.sendall(reply)
                    if (reply == b"") if close is None else close:
                        c.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        srv.close()
        for c in conns:
            with contextlib.suppress(OSError):
                c.close()
        t.join(5)


@pytest.fixture
def short_probe(monkeypatch):
    monkeypatch.setattr(scheduler, "PROBE_SECONDS", 2.0)


@pytest.mark.parametrize("kind", list(REPLIES))
def test_probe_refuses_what_is_not_a_scheduler(kind, short_probe, capfd):
    with listener(REPLIES[kind]) as port:
        t0 = time.perf_counter()
        with pytest.raises(InputError, match=f"^scheduler='tcp://127.0.0.1:{port}': (no answer|not a Dask sch)"):
            scheduler.probe(f"tcp://127.0.0.1:{port}")
        assert time.perf_counter() - t0 < scheduler.PROBE_SECONDS + 6
    assert "Traceback" not in capfd.readouterr().err  # Dask's own CRITICAL log of the garbage is kept quiet


def test_nothing_listening_is_quick():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    t0 = time.perf_counter()
    with pytest.raises(InputError, match=f"^scheduler='tcp://127.0.0.1:{port}': cannot connect \\(Connection refused"):
        scheduler.probe(f"tcp://127.0.0.1:{port}", seconds=10)
    with pytest.raises(InputError, match=f"^--scheduler tcp://127.0.0.1:{port}: cannot connect \\(Connection refused"):
        scheduler.probe(f"tcp://127.0.0.1:{port}", seconds=10, option="--scheduler")  # as the CLI names it
    assert time.perf_counter() - t0 < 2


@pytest.mark.parametrize(("address", "message"), [
    ("ucx://127.0.0.1:8786", "the scheme ucx:// is not supported"),
    ("inproc://127.0.0.1/1/2", "the scheme inproc:// is not supported"),
    ("ws://127.0.0.1:8786", "the scheme ws:// is not supported"),
    ("http://127.0.0.1:8787", "the scheme http:// is not supported"),
    ("tls://127.0.0.1:8786", "tls:// needs Dask's TLS settings"),
    ("tcp://127.0.0.1", "needs a port from 1 to 65535"),
    ("tcp://127.0.0.1:0", "needs a port from 1 to 65535"),
    ("tcp://127.0.0.1:99999", "needs a port from 1 to 65535"),
    ("tcp://127.0.0.1:８７８６", "needs a port"),
    ("tcp://:8786", "'' is not a host name or address"),
    ("tcp://a b:8786", "'a b' is not a host name"),
    ("tcp://x/y:8786", "'x/y' is not a host name"),
    ("tcp://127.0.0.1:8786\n", None),  # stripped: valid
    ("tcp://\x00:1", "not an address"),
    ("", "give an address"),
    ("x" * 1000, "not an address"),
])
def test_addresses_are_checked_before_connecting(address, message):
    if message is None:
        assert scheduler.check_address(address) == "tcp://127.0.0.1:8786"
        return
    with pytest.raises(InputError, match=message) as library:
        scheduler.check_address(address)
    with pytest.raises(InputError, match=message) as cli:
        scheduler.check_address(address, "--scheduler")
    assert str(library.value).startswith("scheduler") and str(cli.value).startswith("--scheduler")


def test_plain_host_port_and_ipv6():
    assert scheduler.check_address("localhost:8786") == "tcp://localhost:8786"
    assert scheduler.check_address("tcp://[::1]:8786") == "tcp://[::1]:8786"


@pytest.mark.parametrize("kind", ["silent", "http", "short frame", "ucx", "tls"])
def test_cli_exit_2_in_bounded_time(kind, tiny_run, tmp_path, short_probe):
    out = tmp_path / "out"
    with listener(REPLIES.get(kind)) as port:
        address = {"ucx": "ucx://127.0.0.1:8786", "tls": "tls://127.0.0.1:8786"}.get(kind, f"tcp://127.0.0.1:{port}")
        t0 = time.perf_counter()
        r = CliRunner().invoke(app, ["sweep", str(tiny_run / "checkpoint-500"), "--scheduler", address, "--out",
                                     str(out), "--metrics", "symmetry", "-f", "json"])
        assert time.perf_counter() - t0 < 20  # the probe's 2 s (and the thread's 5 s grace), start-up included
    assert one_error_line(r).startswith(f"error: --scheduler {address}")
    assert not out.exists()


def test_real_executable_silent_listener_default_deadline(tiny_run, tmp_path):
    """The issue's case through the real executable and the default deadline: a 127.0.0.1 listener that never
    answers is refused in well under a minute (it hung past 400 s)."""
    with listener(None) as port:
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "qkinspect", "sweep", str(tiny_run / "checkpoint-500"),
                            "--scheduler", f"tcp://127.0.0.1:{port}", "--out", str(tmp_path / "out")],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
        elapsed = time.perf_counter() - t0
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [f"error: --scheduler tcp://127.0.0.1:{port}: no answer from a Dask "
                                             f"scheduler within {scheduler.PROBE_SECONDS:g} s"]
    assert elapsed < 60
