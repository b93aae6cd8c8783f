"""--help at 80 and 120 columns: every paragraph fills its lines (a line ends early only where a paragraph ends),
every word of every help text is printed whole and in order, and nothing is cut ("…" only where the text has one).
Docstrings wrapped in the source once broke sentences mid-line, and a six-column option table cut words."""

from __future__ import annotations

import pytest
import typer

from qkinspect.cli.app import app
from qkinspect.cli.help_render import reflow

GROUP = typer.main.get_command(app)
COMMANDS = sorted(GROUP.commands)
BORDER = "│╭╮╰╯─"


def texts(name: str | None) -> list[str]:
    """Every text the help of `name` (None: the root) prints: prose paragraphs and help records."""
    cmd = GROUP if name is None else GROUP.commands[name]
    ctx = cmd.make_context(name or "qkinspect", [], resilient_parsing=True)
    out = reflow(cmd.help).split("\n\n")
    for p in cmd.get_params(ctx):
        rec = p.get_help_record(ctx)
        out += list(rec) if rec else []
    if name is None:
        out += [reflow(c.help).split("\n\n")[0] for c in GROUP.commands.values()]
    return out


def words(text: str) -> list[str]:
    return "".join(" " if ch in BORDER else ch for ch in text).split()


def contains_run(haystack: list[str], needle: list[str]) -> bool:
    n = len(needle)
    return any(haystack[i:i + n] == needle for i in range(len(haystack) - n + 1))


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("name", [None, *COMMANDS])
def test_help_wraps_at_words_and_fills_its_lines(cli, name, width):
    r = cli(*([name] if name else []), "--help", env={"COLUMNS": str(width)})
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= width
    printed = words(r.stdout)
    for text in texts(name):
        assert contains_run(printed, text.split()), f"{name}: not printed whole at {width} columns: {text!r}"
    assert r.stdout.count("…") == sum(t.count("…") for t in texts(name))  # nothing cut
    # Prose (outside the panels): a line followed by more of its paragraph could not have held the next word.
    prose = [line.rstrip() for line in lines[: next(i for i, x in enumerate(lines) if x.startswith("╭"))]]
    for line, nxt in zip(prose[2:], prose[3:], strict=False):  # after the usage line
        if line and nxt:
            assert len(line) + 1 + len(nxt.split()[0]) > width, f"{name}: line ends early: {line!r}"


def test_reflow_joins_lines_within_paragraphs_only():
    doc = """First line
    goes on.

    Second paragraph
    too.

    \b
    kept  as
    it is
    """
    assert reflow(doc) == "First line goes on.\n\nSecond paragraph too.\n\nkept  as\nit is"
