import subprocess
import sys

from typer.testing import CliRunner

from qkinspect import __version__
from qkinspect.cli.app import app

runner = CliRunner()


def test_version():
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0
    assert __version__ in r.stdout


def test_unknown_option_is_one_line_exit_2():
    r = runner.invoke(app, ["info", "--bogus"])
    assert r.exit_code == 2
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1


def test_python_m_help_subprocess():
    p = subprocess.run([sys.executable, "-m", "qkinspect", "--help"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0
    assert "qkinspect" in p.stdout
