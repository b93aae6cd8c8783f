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


@pytest.mark.parametrize("name", COMMANDS)
def test_help_speaks_in_metavars_not_python_types(cli, name):
    r = cli(name, "--help", env={"COLUMNS": "120"})
    assert r.exit_code == 0, r.stderr
    for python_type in ("<bool>", "<str>", "<int>", "<path>", "{MODEL"):
        assert python_type not in r.stdout, (name, python_type)


def test_compare_usage_and_plot_kinds(cli):
    assert "Usage: qkinspect compare [OPTIONS] MODEL_A MODEL_B" in cli("compare", "--help").stdout
    out = cli("plot", "--help", env={"COLUMNS": "120"}).stdout
    words = {w.strip("│,.") for w in out.split()}
    assert {"symmetry", "distribution", "heads", "compare", "metric"} <= words  # whole words, not cut mid-word


@pytest.mark.parametrize("args, message", [
    (["plot", "--kind", "nope", "-o", "x.png"], "error: --kind: 'nope' is not one of symmetry, overlap, spectra, "
                                                "rank, distribution, heads, compare, metric"),
    (["analyze", "--format", "nope"], "error: --format: 'nope' is not one of table, json, ndjson, csv"),
    (["spectrum", "--head", "12"], "error: --head: 12 is out of range; encoder has heads 0-11"),
    (["spectrum", "--layer", "7"], "error: --layer: 7 is out of range; encoder has layers 0-5"),
    (["plot", "--kind", "heads", "--layer", "9", "-o", "x.png"], "error: --layer: 9 is out of range"),
])
def test_errors_name_the_option_typed(cli, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    r = cli(*args)
    assert r.exit_code == 2 and r.stdout == ""
    lines = [line for line in r.stderr.splitlines() if not line.startswith("note:")]
    assert len(lines) == 1 and lines[0].startswith(message), lines
    assert "[" not in lines[0] and "Value error" not in lines[0]


def test_metric_options_are_consistent():
    """-m is --metrics wherever it exists; plot's single metric is --metric without the short form."""
    for name, cmd in typer.main.get_command(app).commands.items():
        for p in cmd.params:
            if "-m" in p.opts:
                assert "--metrics" in p.opts, name
