"""--help drawn by qkinspect: prose re-flowed into paragraphs, options as a definition list, at any width.

Docstrings are wrapped in the source at 120 columns; typer's rich help keeps those line breaks in the command list
and in every paragraph after the first, so sentences broke mid-line, and at 80 columns its six-column option table
left the help text 20 columns and cut words with "…". Here every paragraph is one line that rich wraps at word
boundaries to the terminal, and each option's names and metavar sit beside its help where they fit in a third of
the width, else on their own line above it. Only public click APIs are read (`get_usage`, `get_help_record`,
`list_commands`), so a typer release cannot change the layout behind our back.
"""

from __future__ import annotations

import inspect

from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text


def reflow(text: str | None) -> str:
    """Paragraphs (blank-line separated) with their single line breaks turned into spaces; a paragraph that starts
    with click's `\\b` marker keeps its lines."""
    paragraphs = inspect.cleandoc(text or "").partition("\f")[0].split("\n\n")
    out = []
    for p in paragraphs:
        if p.startswith("\b"):
            out.append(p.lstrip("\b").strip("\n"))
        elif p.strip():
            out.append(" ".join(p.split()))
    return "\n\n".join(out)


def first_paragraph(text: str | None) -> str:
    return reflow(text).split("\n\n")[0]


def _definitions(title: str, rows: list[tuple[str, str]], width: int) -> Panel:
    """A panel of (term, description) rows: the term beside its description when it fits in the term column
    (at most a third of the width), else alone on a line with the description below it."""
    inner = width - 4  # the panel's border and padding
    fits = [len(term) for term, _ in rows if len(term) <= max(12, inner // 3)]
    col = max(fits, default=12)
    items: list = []
    for term, desc in rows:
        grid = Table.grid(padding=(0, 2, 0, 0), expand=True)
        grid.add_column(width=col, no_wrap=True)
        grid.add_column(ratio=1, overflow="fold")
        if len(term) <= col:
            grid.add_row(Text(term, style="bold cyan"), Text(desc))
        else:
            items.append(Text(term, style="bold cyan", overflow="fold"))
            grid.add_row("", Text(desc))
        items.append(grid)
    return Panel(Group(*items), title=title, title_align="left", border_style="dim", box=box.ROUNDED, width=width)


def render(command, ctx, console: Console | None = None) -> None:
    """Print `command`'s help for `ctx` (a click command or group) on `console` (default: stdout)."""
    console = console or Console(highlight=False)
    width = console.width
    parts: list = [Text(command.get_usage(ctx)), Text("")]
    prose = reflow(command.help)
    if prose:
        for i, para in enumerate(prose.split("\n\n")):
            parts += [Text(para, style="" if i else "bold"), Text("")]
    params = [p for p in command.get_params(ctx) if not getattr(p, "hidden", False)]
    records = [(p, p.get_help_record(ctx)) for p in params]
    arguments = [r for p, r in records if r and p.param_type_name == "argument"]
    options = [r for p, r in records if r and p.param_type_name != "argument"]
    if arguments:
        parts.append(_definitions("Arguments", arguments, width))
    if options:
        parts.append(_definitions("Options", options, width))
    names = command.list_commands(ctx) if hasattr(command, "list_commands") else []
    commands = [(n, command.get_command(ctx, n)) for n in names]
    rows = [(n, first_paragraph(c.short_help or c.help)) for n, c in commands if c is not None and not c.hidden]
    if rows:
        parts.append(_definitions("Commands", rows, width))
    console.print(Group(*parts))
