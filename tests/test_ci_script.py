"""`.ci/run` runs the README's test command verbatim, prints the versions it resolved before any test runs, and
fails when a test fails. Run here with stand-ins for python3, pip, python, pytest and ruff that only log."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KEY = ("torch", "transformers", "numpy", "dask", "distributed", "matplotlib", "gguf", "safetensors",
       "huggingface_hub", "tokenizers", "hypothesis", "pytest")


def readme_test_command() -> str:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)
    (cmd,) = [b.strip() for b in blocks if b.strip().endswith("pytest")]
    return cmd


def test_the_readme_command_is_run_verbatim():
    lines = (ROOT / ".ci/run").read_text(encoding="utf-8").splitlines()
    assert readme_test_command() in lines
    assert "set -euo pipefail" in lines


def test_versions_lists_every_key_package():
    out = subprocess.run([sys.executable, str(ROOT / ".ci/versions.py")], capture_output=True, text=True, check=True)
    names = {line.split()[0] for line in out.stdout.splitlines()[1:]}
    assert {"python", *KEY} <= names
    assert re.search(r"^  torch \S+", out.stdout, re.M)


def fake(bin_dir: Path, name: str, body: str) -> None:
    p = bin_dir / name
    p.write_text(f"#!/bin/sh\necho \"{name} $*\" >> \"$LOG\"\n{body}\n")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("pytest_rc", [0, 1])
def test_versions_come_first_and_a_failing_test_fails_the_run(tmp_path, pytest_rc):
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci/run", tmp_path / ".ci/run")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # python3 -m venv DIR: a venv whose activate script changes nothing
    fake(bin_dir, "python3", 'mkdir -p "$3/bin" && : > "$3/bin/activate"')
    for name in ("pip", "python", "ruff"):
        fake(bin_dir, name, "")
    fake(bin_dir, "pytest", f"exit {pytest_rc}")
    log = tmp_path / "log"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin", "LOG": str(log)}
    r = subprocess.run(["bash", str(tmp_path / ".ci/run")], env=env, capture_output=True, text=True, timeout=60)
    calls = log.read_text().splitlines()
    assert (r.returncode != 0) == bool(pytest_rc), r.stderr
    assert calls.index("python .ci/versions.py") < calls.index("pytest ")
    assert calls[calls.index("pytest ") - 1] == "pip install -e .[test]"
    assert ("ruff check" in calls) == (pytest_rc == 0)


def test_the_readme_says_cpu_torch_before_any_install_that_pulls_torch():
    """A reader following the Quick start in order installs the CPU torch before the command that would fetch the
    CUDA build; and the README says why .ci/run's pin gets a CPU wheel (not that pinning never helps)."""
    quick = (ROOT / "README.md").read_text(encoding="utf-8").split("## Quick start", 1)[1].split("\n## ", 1)[0]
    cpu = quick.index("--index-url https://download.pytorch.org/whl/cpu")
    assert cpu < quick.index('pip install -e ".[demo]"') and cpu < quick.index('pip install -e ".[test]"')
    ci = (ROOT / ".ci/run").read_text(encoding="utf-8")
    if "torch==" in ci:
        assert "local wheel folder" in " ".join(quick.split()) and "local wheel folder" in ci
    assert "does not change that" not in quick
