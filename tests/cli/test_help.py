"""Every command is documented: its --help says what it does and shows an example."""

from __future__ import annotations

import pytest
import typer

from qkinspect.cli.app import app

COMMANDS = sorted(c.name or c.callback.__name__ for c in app.registered_commands)


def test_the_commands_exist():
    assert {"info", "analyze", "spectrum", "compare", "extract"} <= set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_help_has_text_and_example(cli, name):
    r = cli(name, "--help")
    assert r.exit_code == 0, r.stderr
    assert "Example" in r.stdout and f"qkinspect {name}" in r.stdout
    cmd = typer.main.get_command(app).commands[name]
    assert cmd.help and len(cmd.help.split()) > 5


def test_root_help_lists_commands_and_completion(cli):
    r = cli("--help")
    assert r.exit_code == 0
    for name in COMMANDS:
        assert name in r.stdout
    assert "--install-completion" in r.stdout


def test_show_completion_script(cli):
    r = cli("--show-completion", "bash")
    assert r.exit_code == 0
    assert "complete" in r.stdout and "qkinspect" in r.stdout.lower()


def test_install_completion_writes_the_shell_setup(cli, tmp_path):
    r = cli("--install-completion", "bash", env={"HOME": str(tmp_path), "SHELL": "/bin/bash"})
    assert r.exit_code == 0, r.stderr
    assert "completion installed" in (r.stdout + r.stderr).lower()
    assert "qkinspect" in (tmp_path / ".bashrc").read_text().lower()
