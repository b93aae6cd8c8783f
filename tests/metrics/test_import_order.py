"""The metrics engine reads from the ground up: no module of qkinspect.metrics imports, at any depth or from inside
a function, a module that imports it back, and in a fresh interpreter, imported in dependency order, each module
loads no metrics module above it. (backend once built a HeadProducts for the benchmark while lapack took backend's
symbol lookup: a circle.)"""

from __future__ import annotations

import ast
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imports_of(source: str, package: str, modules: set[str]) -> set[str]:
    """The modules of `package` (named in `modules`) that `source` imports anywhere: module level, inside
    functions, under TYPE_CHECKING."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from qkinspect.metrics import backend` names a module; `from x.y import f` names x.y
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        found |= {n for n in names if n in modules}
    return found


def graph(folder: Path, package: str) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports, for every module file in `folder` (not __init__)."""
    files = {f"{package}.{p.stem}": p for p in sorted(folder.glob("*.py")) if p.name != "__init__.py"}
    return {name: imports_of(p.read_text(encoding="utf-8"), package, set(files)) - {name}
            for name, p in files.items()}


def order(edges: dict[str, set[str]]) -> list[str]:
    """The modules, each after every module it imports; pytest.fail naming the circle where there is one."""
    try:
        return list(TopologicalSorter(edges).static_order())
    except CycleError as e:
        pytest.fail(f"import circle: {' -> '.join(e.args[1])}")


def test_the_metrics_modules_import_no_circle():
    got = order(graph(ROOT / "qkinspect" / "metrics", "qkinspect.metrics"))
    assert got.index("qkinspect.metrics.backend") < got.index("qkinspect.metrics.products")


def test_the_check_sees_a_circle_through_a_function(tmp_path):
    (tmp_path / "backend.py").write_text("def f():\n    from pkg.products import HeadProducts\n")
    (tmp_path / "products.py").write_text("from pkg import factored\n")
    (tmp_path / "factored.py").write_text("import torch\nfrom pkg.backend import torch_symbol\n")
    with pytest.raises(pytest.fail.Exception, match="import circle"):
        order(graph(tmp_path, "pkg"))
    (tmp_path / "backend.py").write_text("import ctypes\n")
    assert order(graph(tmp_path, "pkg")) == ["pkg.backend", "pkg.factored", "pkg.products"]


def test_imported_in_dependency_order_each_loads_nothing_above_it():
    """In one fresh interpreter, after the package itself (its __init__ imports `registry`), each module, imported
    after every module below it, loads no other metrics module: what it needs at import time is below it."""
    names = order(graph(ROOT / "qkinspect" / "metrics", "qkinspect.metrics"))
    script = (
        "import importlib, sys\n"
        "import qkinspect.metrics\n"
        "for m in sys.argv[1:]:\n"
        "    before = {n for n in sys.modules if n.startswith('qkinspect.metrics.')}\n"
        "    importlib.import_module(m)\n"
        "    extra = {n for n in sys.modules if n.startswith('qkinspect.metrics.')} - before - {m}\n"
        "    assert not extra, f'{m} loads {sorted(extra)}, above it'\n"
    )
    r = subprocess.run([sys.executable, "-c", script, *names], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
