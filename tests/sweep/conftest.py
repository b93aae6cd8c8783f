"""Fixtures for the sweep tests: tiny checkpoints written in code, and a real Dask cluster on 127.0.0.1
(`dask scheduler` and `dask worker` processes) started for the module and killed afterwards."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.conftest import save_bert

NEEDS_DASK = "the sweep needs the sweep extra: pip install 'qkinspect[sweep]'"

ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT = 90  # seconds for the scheduler and workers to come up (a loaded machine is slow)
STEPS = (500, 1000, 1500, 2000, 2500, 3000)


def make_run(folder: Path, *, hidden: int = 32, layers: int = 2, steps=STEPS) -> Path:
    """A training run's folder: checkpoint-<step>/ of a tiny BERT, other weights at every step."""
    for i, step in enumerate(steps):
        save_bert(folder / f"checkpoint-{step}", seed=i, hidden=hidden, heads=8 if hidden >= 64 else 4,
                  layers=layers)
    return folder


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("run"))


@pytest.fixture(scope="session")
def medium_run(tmp_path_factory) -> Path:
    """Checkpoints that take a second or two each with every metric: long enough to be caught in the middle."""
    return make_run(tmp_path_factory.mktemp("medium"), hidden=256, layers=4)


MEDIUM_OPTIONS = {"metrics": ["all"], "layer_form": True}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DaskCluster:
    """A scheduler and workers as separate processes, as a user would start them by hand."""

    def __init__(self, folder: Path):
        self.folder, self.port = folder, _free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.dask = shutil.which("dask", path=str(Path(sys.executable).parent)) or shutil.which("dask")

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.folder / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        self.procs[name] = subprocess.Popen([self.dask, *args], stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                            cwd=self.folder, start_new_session=True)

    def start_scheduler(self) -> None:
        self._spawn("scheduler", "scheduler", "--host", "127.0.0.1", "--port", str(self.port), "--no-dashboard")

    def add_worker(self, name: str) -> None:
        """A worker without a nanny, so that killing its process loses it for good."""
        self._spawn(name, "worker", self.address, "--name", name, "--nthreads", "1", "--host", "127.0.0.1",
                    "--no-nanny", "--no-dashboard", "--local-directory", str(self.folder / name))

    def wait_for_workers(self, n: int) -> None:
        from distributed import Client

        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            try:
                with Client(self.address, timeout="5s") as client:
                    client.wait_for_workers(n, timeout=max(1, deadline - time.monotonic()))
                    return
            except (OSError, TimeoutError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the Dask cluster did not start in {STARTUP_TIMEOUT} s: "
                                       f"{self.folder}/*.log") from None
                time.sleep(0.5)

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def close(self) -> None:
        for name in list(self.procs)[::-1]:
            self.kill(name)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = DaskCluster(tmp_path_factory.mktemp("dask"))
    try:
        c.start_scheduler()
        c.add_worker("w1")
        c.add_worker("w2")
        c.wait_for_workers(2)
        yield c
    finally:
        c.close()


@pytest.fixture
def cli():
    """invoke(*args) -> Result with separate .stdout and .stderr."""
    from typer.testing import CliRunner

    from qkinspect.cli.app import app

    runner = CliRunner()

    def invoke(*args, **kw):
        return runner.invoke(app, [str(a) for a in args], **kw)

    return invoke


def analyze_table(run: Path, steps=STEPS, by: str = "head", **options) -> list[dict]:
    """What `analyze` gives on each checkpoint, as the sweep's tidy rows."""
    import qkinspect
    from qkinspect.documents import json_safe

    rows = []
    for step in steps:
        result = qkinspect.analyze(run / f"checkpoint-{step}", **options)
        records = result.heads if by == "head" else result.layers
        rows += [{"checkpoint": str(run / f"checkpoint-{step}"), "step": step, **r.row()} for r in records]
    return json_safe(rows)


def assert_same_table(got: list[dict], expected: list[dict]) -> None:
    """Same rows, same columns in the same order, numbers equal to float32 rounding."""
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert list(a) == list(b)
        for k in a:
            if isinstance(b[k], float):
                assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-7), (k, a, b)
            else:
                assert a[k] == b[k], (k, a, b)
