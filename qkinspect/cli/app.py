"""The Typer application: global options, command discovery, and the one place errors become exit codes."""

from __future__ import annotations

import contextlib
import importlib
import os
import pkgutil
import signal
import sys
import traceback

import typer
from typer.core import TyperCommand, TyperGroup

from qkinspect.cli.help_format import clean_usage_error, install
from qkinspect.errors import QkinspectError
from qkinspect.files import Terminated
from qkinspect.version import __version__

try:  # typer >= 0.26 vendors its own click
    from typer._click import exceptions as click_exc
except ImportError:  # pragma: no cover - older typer on plain click
    from click import exceptions as click_exc

_EXIT = tuple({typer.Exit, getattr(click_exc, "Exit", typer.Exit)})
_ABORT = tuple({typer.Abort, getattr(click_exc, "Abort", typer.Abort)})
_NO_ARGS = getattr(click_exc, "NoArgsIsHelpError", None)

_state = {"debug": False}


def _error(message: str) -> None:
    # One line on stderr, whatever the message held: control characters (a NUL byte from a file's text) shown
    # escaped, never sent to the terminal, and never an empty line.
    text = " ".join(str(message).split())
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    print(f"error: {text or 'an error without a message (run with --debug for the traceback)'}", file=sys.stderr)


class _Interrupted(Exception):
    """Ctrl-C inside a command (typer would turn it into a silent exit 130)."""


class _PipeClosed(Exception):
    """The reader of stdout went away (`| head`); typer would exit 1."""


class QkCommand(TyperCommand):
    """A command whose --help qkinspect draws (qkinspect.cli.help_render)."""

    def format_help(self, ctx, formatter):
        from qkinspect.cli.help_render import render

        render(self, ctx)


class QkGroup(TyperGroup):
    """Runs commands with click's standalone mode off so that every failure ends here:
    usage errors and QkinspectError exit 2 (or the error's code) with one line; anything else exits 1."""

    def format_help(self, ctx, formatter):
        from qkinspect.cli.help_render import render

        render(self, ctx)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise _Interrupted() from None
        except BrokenPipeError:
            raise _PipeClosed() from None

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        argv = list(sys.argv[1:] if args is None else args)
        _state["debug"] = "--debug" in argv
        try:
            with _pipe_errors_raised():
                rv = super().main(args=argv, prog_name=prog_name, complete_var=complete_var,
                                  standalone_mode=False, **extra)
                sys.stdout.flush()  # here, not at exit, so that a closed pipe is seen below
        except _EXIT as e:
            _quiet_stdout()
            sys.exit(e.exit_code)
        except _ABORT:
            _error("aborted")
            sys.exit(130)
        except click_exc.UsageError as e:
            if _NO_ARGS is not None and isinstance(e, _NO_ARGS):
                print(e.ctx.get_help())
                sys.exit(0)
            if _state["debug"]:
                traceback.print_exc()
            _error(clean_usage_error(e.format_message()))
            sys.exit(2)
        except click_exc.ClickException as e:
            _error(e.format_message())
            sys.exit(e.exit_code if e.exit_code != 1 else 2)
        except QkinspectError as e:
            if _state["debug"]:
                traceback.print_exc()
            _error(str(e) or f"{type(e).__name__} without a message (run with --debug for the traceback)")
            sys.exit(e.exit_code)
        except (KeyboardInterrupt, _Interrupted):
            _error("interrupted")
            sys.exit(130)
        except (BrokenPipeError, _PipeClosed):
            # The reader went away (`| head -1`): normal use, so exit 0 and say nothing, whatever the format or
            # command. Python would complain again when it flushes stdout at exit: point it at /dev/null (as the
            # Python docs' note on SIGPIPE recommends).
            _quiet_stdout()
            sys.exit(0)
        except Terminated as e:
            # SIGTERM/SIGHUP during a write: the temporary file is gone; now end as the signal would have.
            signal.signal(e.signum, signal.SIG_DFL)
            os.kill(os.getpid(), e.signum)
            raise
        except BaseException as e:  # noqa: BLE001 - pyo3's PanicException (a Rust panic) is a BaseException too
            if isinstance(e, (SystemExit, GeneratorExit)):
                raise
            if _state["debug"]:
                traceback.print_exc()
            else:
                _error(f"internal error: {type(e).__name__}: {e} (run with --debug for the traceback)")
            sys.exit(1)
        if isinstance(rv, int) and rv:
            sys.exit(rv)
        sys.exit(0)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null when its reader has gone, so the flush at exit cannot fail again."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        with contextlib.suppress(OSError, ValueError):  # a stdout without a file descriptor (tests)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


@contextlib.contextmanager
def _pipe_errors_raised():
    """rich (tables, --help) exits 1 on a closed pipe by itself; make it raise BrokenPipeError, handled above."""
    from rich.console import Console

    def closed(console) -> None:
        raise BrokenPipeError

    saved = Console.on_broken_pipe
    Console.on_broken_pipe = closed
    try:
        yield
    finally:
        Console.on_broken_pipe = saved


app = typer.Typer(
    cls=QkGroup,
    name="qkinspect",
    help="Inspect the query-key geometry of trained attention heads, from the weights alone.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        try:
            print(f"qkinspect {__version__}", flush=True)
        except BrokenPipeError:  # click would exit 1 on it here, outside any command
            raise _PipeClosed() from None
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit.", callback=_version,
                                 is_eager=True),
    debug: bool = typer.Option(False, "--debug", help="Show a traceback on errors."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars (notes and warnings still print)."),
) -> None:
    """Inspect the query-key geometry of trained attention heads, from the weights alone.

    Example: qkinspect analyze            (the bundled demo model)
    """
    _state["debug"] = debug
    from qkinspect.cli.output import QUIET

    QUIET["on"] = quiet


def _register_commands() -> None:
    from qkinspect.cli import commands

    for mod in sorted(m.name for m in pkgutil.iter_modules(commands.__path__)):
        module = importlib.import_module(f"qkinspect.cli.commands.{mod}")
        register = getattr(module, "register", None)
        if register is not None:
            register(app)
    for info in app.registered_commands:
        if info.cls in (None, TyperCommand):  # typer's default: give it qkinspect's --help
            info.cls = QkCommand


_register_commands()
install()  # --help without typer's <bool>/<str> types


def main() -> None:
    app()
