"""--help and usage errors in the words a user types.

typer 0.29 prints a type after every parameter (`--fold-ln <bool>`, `MODEL <str>`), puts a required argument in
braces in the usage line (`{MODEL_A} {MODEL_B}`), and lets the choices of an enum option wrap mid-word; a bad
choice reads "Invalid value for '--kind' / '-k': Value error, 'nope' is not one of 'symmetry', …". `install()`
makes flags show nothing, options and arguments their metavar, choices `a|b|c` only when short, and
`clean_usage_error` rewrites the message as "--kind: 'nope' is not one of symmetry, overlap, …".
"""

from __future__ import annotations

import re

from qkinspect.suggest import did_you_mean

CHOICES_WIDTH = 24  # longer choice lists are given in the option's help text instead of the type column

_INVALID = re.compile(r"Invalid value for '(-[-\w]+)'(?: / '-\w+')?: (?:Value error, )?(.*)", re.S)
_PYTHON_TYPE = re.compile(r"<(?:str|int|float|path|file|directory|text|integer)(?:\.\.\.)?>")
_ONE_OF = re.compile(r"is not one of ((?:'[^']*'(?:, )?)+)\.?")


def install() -> None:
    """Patch typer's help rendering (idempotent; a typer without these hooks is left as it is)."""
    try:
        from typer import core
    except ImportError:  # pragma: no cover
        return
    option, argument = getattr(core, "TyperOption", None), getattr(core, "TyperArgument", None)
    if option is None or argument is None or getattr(option, "_qk_help", False):
        return
    plain_option = option.display_type_rich

    def option_type(self, ctx):
        if self.metavar is not None:
            return self.metavar
        if getattr(self, "is_flag", False) or getattr(self, "is_bool_flag", False):
            return None
        shown = plain_option(self, ctx)
        if shown is not None and _PYTHON_TYPE.fullmatch(shown):
            return (self.name or "value").upper()  # --revision <str> -> --revision REVISION
        return None if shown is None or len(shown) > CHOICES_WIDTH else shown

    def argument_type(self, ctx):
        return None  # the argument's name (its metavar) says it

    def usage_name(self):
        name = self.display_name_raw
        name = name if self.required else f"[{name}]"
        return name + ("..." if self.nargs != 1 else "")

    option.display_type_rich = option_type
    argument.display_type_rich = argument_type
    if hasattr(argument, "_usage_display_name"):
        argument._usage_display_name = usage_name
    option._qk_help = True


def clean_usage_error(message: str) -> str:
    """"Invalid value for '--kind' / '-k': Value error, 'nope' is not one of 'a', 'b'." ->
    "--kind: 'nope' is not one of a, b"; other messages are returned as they are."""
    m = _INVALID.fullmatch(message.strip())
    if not m:
        return message
    option, rest = m.groups()
    bad = re.match(r"'([^']*)' is not one of", rest)

    def listed(k: re.Match) -> str:
        names = re.findall(r"'([^']*)'", k.group(1))
        return "is not one of " + ", ".join(names) + (did_you_mean(bad.group(1), names) if bad else "")

    return f"{option}: {_ONE_OF.sub(listed, rest).rstrip('.')}"
