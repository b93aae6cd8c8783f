"""The tests use no private API of their dependencies: a `obj._name` that neither qkinspect, bench/ nor the tests
define is some library's internal (transformers' `_get_embed_positions`, gone in 5.x, once failed the suite on a
fresh machine), and so is an import from a private module. The few that have no public equivalent are listed with
the reason."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ALLOWED = {
    # matplotlib: an Axes made by fig.colorbar links to its Colorbar only through this attribute
    "_colorbar": "tests/report/test_figures.py",
    # torch documents TorchDispatchMode (docs/notes/extending) at this path; there is no public one
    "torch.utils._python_dispatch": "tests/metrics/test_cost.py",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _sources(*folders: str) -> list[Path]:
    return [p for f in folders for p in sorted((ROOT / f).rglob("*.py"))]


def defined_names(path: Path, any_attribute: bool) -> set[str]:
    """Names a file defines: functions, classes, variables, arguments, keywords (`__dict__.update(_x=…)`), imports,
    and attributes it assigns (only on `self`/`cls` when `any_attribute` is false: a test setting a library's
    private attribute does not make it ours)."""
    out: set[str] = set()
    for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, ast.keyword) and n.arg:
            out.add(n.arg)
        elif isinstance(n, ast.alias):
            out.add((n.asname or n.name).split(".")[-1])
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            if any_attribute or (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")):
                out.add(n.attr)
    return out


def private_uses(source: str, where: str, ours: set[str]) -> list[str]:
    """`where:line: name` for each private attribute or module that `source` (the file `where`) uses and we don't
    define."""
    found = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Attribute) and _private(n.attr) and n.attr not in ours:
            name = n.attr
        elif isinstance(n, ast.ImportFrom) and n.module and any(map(_private, n.module.split("."))):
            name = n.module
        else:
            continue
        if ALLOWED.get(name) != where:
            found.append(f"{where}:{n.lineno}: {name}")
    return found


def our_names() -> set[str]:
    ours: set[str] = set()
    for p in _sources("qkinspect", "bench"):
        ours |= defined_names(p, any_attribute=True)
    for p in _sources("tests"):
        ours |= defined_names(p, any_attribute=False)
    return ours


def test_no_private_api_of_a_dependency():
    ours = our_names()
    found = [use for p in _sources("tests")
             for use in private_uses(p.read_text(encoding="utf-8"), p.relative_to(ROOT).as_posix(), ours)]
    assert not found, "private API of a dependency (use a public one, or write the reference out):\n" + "\n".join(found)


def test_the_check_sees_what_broke():
    """The check would have caught the calls that broke or would break on the next release."""
    source = ("def f(attn, pos, config):\n"
              "    config._attn_implementation = 'eager'\n"
              "    return attn._get_embed_positions(pos)\n"
              "from transformers.models._private import x\n")
    found = private_uses(source, "tests/x.py", our_names())
    assert sorted(found) == ["tests/x.py:2: _attn_implementation", "tests/x.py:3: _get_embed_positions",
                             "tests/x.py:4: transformers.models._private"]
