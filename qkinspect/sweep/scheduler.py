"""A Dask scheduler's address (`run_sweep(scheduler=)`, the CLI's `--scheduler`): checked before anything
connects, then asked who it is, in bounded time.

An address names a machine and a port the user typed or pasted: it may be a typo, a web server, a port that
accepts connections and never answers, or something made to misbehave. Dask's own client trusts the peer (an HTTP
reply read as a Dask frame asks for 3 EiB; a port that never answers hangs past its connect timeout), so before a
`Client` is made:

1. the address is parsed: `tcp://HOST:PORT` (or `HOST:PORT`), or `tls://HOST:PORT` when Dask's TLS settings
   (`distributed.comm.tls.*`) give a client certificate; any other scheme (`ucx://`, `inproc://`, `ws://`, …), a
   missing or out-of-range port, or odd characters are refused;
2. a plain TCP connection is made (nothing listening is said at once: `cannot connect (Connection refused)`);
3. the scheduler is asked who it is (Dask's `identity` call) on a connection of its own, the whole of it (connect,
   handshake, reply) under one deadline, `PROBE_SECONDS`, in a thread of its own: a reply that is not a Dask
   scheduler's, any error, or no reply in time is one line, exit 2.

Each error names the option as the caller spells it (`option`: "scheduler" by default, "--scheduler" from the CLI).

Example:
    >>> address = check_address("tcp://head-node:8786")  # doctest: +SKIP
    >>> probe(address)                                      # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import threading
from collections.abc import Iterator
from typing import Any

from qkinspect.errors import InputError, said

PROBE_SECONDS = 20.0  # connect + handshake + identity reply, all of it
SCHEMES = ("tcp", "tls")
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]{1,253})$")


def check_address(address: Any, option: str = "scheduler") -> str:
    """The address as Dask takes it (`tcp://HOST:PORT`), or InputError saying what is wrong with it."""
    if not isinstance(address, str) or not address.strip():
        raise InputError(f"{option}: give an address such as tcp://head-node:8786")
    text = address.strip()
    shown = text if len(text) <= 80 else text[:77] + "..."
    if len(text) > 300 or not text.isprintable():
        raise InputError(f"{said(option, shown, quoted=True)}: not an address (tcp://HOST:PORT)")
    scheme, sep, location = text.partition("://")
    if not sep:
        scheme, location = "tcp", text
    if scheme not in SCHEMES:
        raise InputError(f"{said(option, shown)}: the scheme {scheme}:// is not supported; use tcp://HOST:PORT "
                         "(or tls:// with Dask's TLS settings)")
    host, colon, port = location.rpartition(":")
    if not colon or not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise InputError(f"{said(option, shown)}: needs a port from 1 to 65535 (tcp://HOST:8786)")
    if not _HOST.match(host):
        raise InputError(f"{said(option, shown)}: {host!r} is not a host name or address")
    if scheme == "tls":
        security(shown, option)
    return f"{scheme}://{host}:{int(port)}"


def security(shown: str = "", option: str = "scheduler") -> Any:
    """Dask's Security from its configuration, for a tls:// address: InputError when it gives no client TLS."""
    from distributed.security import Security

    sec = Security()
    if sec.get_connection_args("client").get("ssl_context") is None:
        raise InputError(f"{said(option, shown)}: tls:// needs Dask's TLS settings (distributed.comm.tls.ca-file, "
                         ".client.cert and .client.key in the Dask configuration); none are set")
    return sec


def probe(address: str, seconds: float | None = None, option: str = "scheduler") -> dict[str, Any]:
    """Ask the scheduler at `address` (from check_address) who it is; its identity, or InputError within
    `seconds` (default PROBE_SECONDS; and a few more for the thread to end) whatever the peer does."""
    seconds = PROBE_SECONDS if seconds is None else seconds
    _reachable(address, seconds, option)
    done: dict[str, Any] = {}

    def run() -> None:
        try:
            done["identity"] = asyncio.run(asyncio.wait_for(_identity(address), seconds))
        except BaseException as e:  # noqa: BLE001 - anything the peer provokes is reported, not raised here
            done["error"] = e

    with _quiet_dask():
        worker = threading.Thread(target=run, name="qkinspect-scheduler-probe", daemon=True)
        worker.start()
        worker.join(seconds + 5)
    if worker.is_alive() or isinstance(done.get("error"), (TimeoutError, asyncio.TimeoutError)):
        raise InputError(f"{said(option, address)}: no answer from a Dask scheduler within {seconds:g} s")
    if "error" in done:
        e = done["error"]
        raise InputError(f"{said(option, address)}: not a Dask scheduler, or not reachable ({_reason(e)})")
    identity = done.get("identity")
    kind = identity.get("type") if isinstance(identity, dict) else None
    if kind != "Scheduler":
        what = f"a Dask {kind}" if isinstance(kind, str) and kind.isidentifier() else "something else"
        raise InputError(f"{said(option, address)}: answered as {what}, not as a Dask scheduler")
    return identity


def _reachable(address: str, seconds: float, option: str) -> None:
    """A plain TCP connection first: nothing listening, an unknown host or no route is said at once (Dask's
    connect would retry until its deadline)."""
    location = address.partition("://")[2]
    host, _, port = location.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=min(seconds, 10.0)):
            pass
    except (OSError, ValueError) as e:
        reason = "no answer" if isinstance(e, TimeoutError) else getattr(e, "strerror", None) or _reason(e)
        raise InputError(f"{said(option, address)}: cannot connect ({reason})") from None


async def _identity(address: str) -> Any:
    from distributed.comm import connect

    kwargs = {"connection_args": security().get_connection_args("client")} if address.startswith("tls") else {}
    comm = await connect(address, timeout=PROBE_SECONDS, **kwargs)
    try:
        await comm.write({"op": "identity", "reply": True})
        return await comm.read()
    finally:
        comm.abort()


def _reason(e: BaseException) -> str:
    text = " ".join(str(e).split())
    text = text if len(text) <= 160 else text[:157] + "..."
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


@contextlib.contextmanager
def _quiet_dask() -> Iterator[None]:
    """Dask logs a peer's garbage at CRITICAL with a traceback; the refusal above says it in one line instead."""
    log = logging.getLogger("distributed")
    level = log.level
    log.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        log.setLevel(level)
