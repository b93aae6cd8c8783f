"""Domain errors. The library raises these; the CLI turns them into one line on stderr and an exit code."""


class QkinspectError(Exception):
    """Base class. `exit_code` 2 means bad input or usage, 3 a sweep with failed checkpoints, 1 an internal error."""

    exit_code = 1


class InputError(QkinspectError):
    """The user's input (a path, an option, a checkpoint) is wrong; exit code 2."""

    exit_code = 2


class ModelNotFoundError(InputError):
    """The model spec names nothing that can be found (path, hub id, cache)."""


class UnsupportedModelError(InputError):
    """The checkpoint's model_type (or format) has no adapter."""


class CheckpointError(InputError):
    """The checkpoint is corrupt, truncated, unsafe, or disagrees with its config."""


class DemoNotInstalledError(InputError):
    """No model was named and the demo extra is not installed."""


class OutputError(InputError):
    """An output file cannot be written."""


class SweepFailed(QkinspectError):
    """A sweep finished with checkpoints that could not be analysed (they are listed); exit code 3, told apart
    from bad input (2) and an internal error (1): the other checkpoints' results are written and output."""

    exit_code = 3


def said(option: str, value: object, quoted: bool = False) -> str:
    """`option` given `value`, as its caller wrote it: "--tokens 1" for a CLI option (it starts with --),
    "tokens=1" for a library argument (the value's repr). `quoted`: the CLI form quotes the value too (for a
    value that may not print)."""
    if option.startswith("--"):
        return f"{option} {value!r}" if quoted else f"{option} {value}"
    return f"{option}={value!r}"


def one_line(e: BaseException, typed: bool = False) -> str:
    """An exception's message on one line (whitespace runs as one space), or its type's name when it has none:
    what a one-line error quotes of a library's exception.

    `typed`: for an exception of any kind a third-party library may raise (`qkinspect.loading.boundary`), the
    message cut at 300 characters and its type named where the message alone says little (``KeyError: 'x'``;
    not for OSError and ValueError, whose messages say what went wrong).
    """
    text = " ".join(str(e).split())
    if not typed or not text:
        return text or type(e).__name__
    text = text[:300]
    plain = isinstance(e, (OSError, ValueError)) and type(e) is not UnicodeDecodeError
    return text if plain else f"{type(e).__name__}: {text}"
