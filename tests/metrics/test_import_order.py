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
    return {n for names in imported_names(source) for n in names if n in modules}


def imported_names(source: str):
    """For each import statement of `source` (anywhere: module level, inside functions, under TYPE_CHECKING), the
    dotted names it may import: `from qkinspect.metrics import backend` names a module, `from x.y import f` names
    x.y, so both x.y and x.y.f are given."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield [node.module, *(f"{node.module}.{a.name}" for a in node.names)]


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


# -- the whole package -----------------------------------------------------------------------------------------

PACKAGE = ROOT / "qkinspect"


def modules(folder: Path = PACKAGE, package: str = "qkinspect") -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name, for its __init__)."""
    out = {}
    for p in sorted(folder.rglob("*.py")):
        parts = [package, *p.relative_to(folder).with_suffix("").parts]
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def imported(source: str, known: set[str]) -> list[tuple[str, str | None]]:
    """(module, name) for each import of a module in `known`, anywhere in `source` (module level, functions,
    TYPE_CHECKING): `from pkg import sub` names the module pkg.sub when it is one, else pkg and the name."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name in known]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in known:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.append((sub, None) if sub in known else (node.module, a.name))
    return out


def package_graph(folder: Path = PACKAGE, package: str = "qkinspect") -> dict[str, set[str]]:
    files = modules(folder, package)
    return {name: {m for m, _ in imported(p.read_text(encoding="utf-8"), set(files))} - {name}
            for name, p in files.items()}


def test_no_module_of_qkinspect_imports_in_a_circle():
    """Function-level imports included: one that breaks a circle at import time still makes the code read both
    ways (estimate <-> run, hf <-> writeback and sweep's store <-> verify once did)."""
    order(package_graph())


def test_the_whole_package_check_sees_a_circle(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "__init__.py").write_text("")
    (tmp_path / "a" / "run.py").write_text("def f():\n    from pkg.a import estimate\n")
    (tmp_path / "a" / "estimate.py").write_text("from pkg.a.run import f\n")
    with pytest.raises(pytest.fail.Exception, match="import circle"):
        order(package_graph(tmp_path, "pkg"))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_private_name_is_imported_from_another_module():
    """A module that needs another's `_name` has found a missing public one, or a piece that belongs elsewhere.
    The one exception: a package's own `_private` modules (`loading/adapters/_decoder.py`) serve that package."""
    files = modules()
    bad = []
    for name, p in files.items():
        for module, what in imported(p.read_text(encoding="utf-8"), set(files)):
            leaf = module.rsplit(".", 1)[-1]
            own = module.rsplit(".", 1)[0] == name.rsplit(".", 1)[0]  # a module of the importer's own package
            if what is not None and _private(what) and not (_private(leaf) and own):
                bad.append(f"{name} imports {module}.{what}")
            if _private(leaf) and not own:
                bad.append(f"{name} imports {module}, private to its package")
        bad += [f"{name} uses {module}.{attr}" for module, attr in _private_attributes(p, files) if module != name]
    assert not bad, bad


def _private_attributes(path: Path, files: dict[str, Path]) -> list[tuple[str, str]]:
    """(module, name) for each `alias._name` where `alias` is a qkinspect module the file imported by name
    (`from qkinspect.sweep import task` ... `task._cores()`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            aliases |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names
                        if f"{node.module}.{a.name}" in files}
        elif isinstance(node, ast.Import):
            aliases |= {a.asname: a.name for a in node.names if a.asname and a.name in files}
    return [(aliases[n.value.id], n.attr) for n in ast.walk(tree) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id in aliases and _private(n.attr)]


def test_nothing_inside_qkinspect_goes_through_the_package_face():
    """`qkinspect/__init__` is the face for users; a module inside that calls `qkinspect.analyze` reaches up
    through it (callback.py and cli/run.py once did)."""
    files = modules()
    users = [name for name, p in files.items() if name not in ("qkinspect", "qkinspect.__main__")
             and "qkinspect" in {m for m, _ in imported(p.read_text(encoding="utf-8"), set(files))}]
    assert not users, users


def cli_users(folder: Path = PACKAGE, package: str = "qkinspect") -> list[str]:
    """'module imports x' for each import of `package`.cli or below it (whether that module exists or not) by a
    module outside `package`.cli and `package`.__main__ (the CLI's entry): module level, inside functions, under
    TYPE_CHECKING; `from package import cli` too."""
    cli = f"{package}.cli"

    def is_cli(name: str) -> bool:
        return name == cli or name.startswith(cli + ".")

    bad = []
    for name, p in modules(folder, package).items():
        if is_cli(name) or name == f"{package}.__main__":
            continue
        for names in imported_names(p.read_text(encoding="utf-8")):
            bad += [f"{name} imports {n}" for n in names if is_cli(n)][:1]
    return bad


def test_the_library_never_imports_the_cli():
    """DESIGN's one way: cli/ parses options, calls the library and chooses the output; the library (a result's
    notebook view included: qkinspect.terminal renders the tables) never reaches up into it."""
    assert not cli_users()


def test_the_cli_check_sees_an_import_inside_a_function(tmp_path):
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "__init__.py").write_text("")
    (tmp_path / "cli" / "tables.py").write_text("from pkg import records\n")
    (tmp_path / "__main__.py").write_text("from pkg.cli import tables\n")
    (tmp_path / "records.py").write_text("class R:\n    def show(self):\n        from pkg.cli.tables import f\n")
    assert cli_users(tmp_path, "pkg") == ["pkg.records imports pkg.cli.tables"]
    (tmp_path / "records.py").write_text("def show():\n    from pkg.cli.gone import f\n")  # a module no longer there
    assert cli_users(tmp_path, "pkg") == ["pkg.records imports pkg.cli.gone"]
    (tmp_path / "records.py").write_text("from pkg import cli\n")
    assert cli_users(tmp_path, "pkg") == ["pkg.records imports pkg.cli"]
    (tmp_path / "records.py").write_text("class R:\n    pass\n")
    assert cli_users(tmp_path, "pkg") == []


def test_metrics_import_nothing_above_them():
    """DESIGN's one way: the metrics take tensors and layers, and know nothing of records, loading or output."""
    below = {"qkinspect.errors", "qkinspect.layer", "qkinspect.suggest"}
    files = modules()
    bad = {name: sorted(up) for name, deps in package_graph().items() if name.startswith("qkinspect.metrics")
           if (up := {d for d in deps if not d.startswith("qkinspect.metrics")} - below)}
    assert not bad, bad
    assert files  # the package was found


def test_report_computes_no_statistic_and_bench_imports_no_cli():
    """report/ only reads and arranges (a rank correlation is the library's: experiment.results); bench/ calls the
    library, never the CLI, to write what it writes."""
    for p in sorted((PACKAGE / "report").rglob("*.py")):
        tree = ast.parse(p.read_text(encoding="utf-8"))
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        assert not any(n.split(".")[0] in ("scipy", "statsmodels", "statistics") for n in names), p
    assert not statistics_computed(PACKAGE / "report" / "experiment")
    for p in sorted((ROOT / "bench").glob("*.py")):
        tree = ast.parse(p.read_text(encoding="utf-8"))
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        assert not any(n == "qkinspect.cli" or n.startswith("qkinspect.cli.") for n in names), p


# Calls that compute a statistic of numbers (numpy's, math's, statistics', scipy's, an array's own method).
STATISTICS = {"mean", "median", "average", "std", "var", "percentile", "quantile", "nanmean", "nanmedian", "nanstd",
              "nanvar", "nanpercentile", "nanquantile", "fsum", "fmean", "spearmanr", "pearsonr", "corrcoef"}


def statistics_computed(folder: Path) -> list[str]:
    """'file:line name' for each call of a statistic (np.mean, math.fsum, values.mean(), ...) in the modules under
    `folder`: the experiment's numbers (an edit's summed cost, the mean Δloss per K) are experiment.costs'."""
    bad = []
    for p in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
                if name in STATISTICS:
                    bad.append(f"{p.name}:{node.lineno} {name}")
    return bad


def test_the_statistics_check_sees_a_mean_and_a_sum(tmp_path):
    """What report/experiment held before the costs moved to the library: np.mean over each K, math.fsum."""
    (tmp_path / "figure.py").write_text("import numpy as np\ndef f(v):\n    return float(np.mean(v))\n")
    (tmp_path / "summary.py").write_text("import math\ndef f(v):\n    return math.fsum(v), v.std()\n")
    assert statistics_computed(tmp_path) == ["figure.py:3 mean", "summary.py:3 fsum", "summary.py:3 std"]
    (tmp_path / "figure.py").write_text("def f(ax, points):\n    ax.plot(*zip(*points))\n")
    (tmp_path / "summary.py").unlink()
    assert statistics_computed(tmp_path) == []


LOWER = ("qkinspect.loading", "qkinspect.metrics")  # the floors every capability stands on
UPPER = ("qkinspect.experiment", "qkinspect.report", "qkinspect.cli")  # what stands on them


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def reaching_up(edges: dict[str, set[str]], lower: tuple[str, ...], upper: tuple[str, ...]) -> dict[str, list[str]]:
    """module -> the modules of `upper` it imports (anywhere, functions included), for each module of `lower`."""
    return {name: sorted(d for d in deps if _within(d, upper)) for name, deps in edges.items()
            if _within(name, lower) and any(_within(d, upper) for d in deps)}


def test_loading_and_metrics_import_nothing_from_the_floors_above():
    """DESIGN's one way: loading/ and metrics/ serve experiment/, report/ and cli/, never the reverse (a
    tokenizer-file check in loading.tokens once came from experiment.model.guard, inside a function)."""
    assert not reaching_up(package_graph(), LOWER, UPPER)


def test_the_layer_check_sees_a_lower_module_reaching_up(tmp_path):
    for sub in ("loading", "experiment"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "__init__.py").write_text("")
    (tmp_path / "loading" / "tokens.py").write_text("def f():\n    from pkg.experiment.guard import regular\n")
    (tmp_path / "experiment" / "guard.py").write_text("from pkg.loading import tokens\n")
    got = reaching_up(package_graph(tmp_path, "pkg"), ("pkg.loading",), ("pkg.experiment",))
    assert got == {"pkg.loading.tokens": ["pkg.experiment.guard"]}
    (tmp_path / "loading" / "tokens.py").write_text("import os\n")
    assert not reaching_up(package_graph(tmp_path, "pkg"), ("pkg.loading",), ("pkg.experiment",))


def defined(source: str) -> set[str]:
    """The names a module defines itself at module level (functions, classes, assignments, at any depth of its
    if/try blocks), not those it imports."""
    out: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                out.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                visit([*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                       *(s for h in getattr(node, "handlers", []) for s in h.body)])

    visit(ast.parse(source).body)
    return out


def borrowed(folder: Path = PACKAGE, package: str = "qkinspect") -> list[str]:
    """`module imports name from other` wherever `other` is a module (not a package's face) that only imports
    `name` itself: the name has a home, and callers import it from there."""
    files = modules(folder, package)
    faces = {name for name, p in files.items() if p.name == "__init__.py"}
    own = {name: defined(p.read_text(encoding="utf-8")) for name, p in files.items()}
    return [f"{name} imports {what} from {module}" for name, p in files.items()
            for module, what in imported(p.read_text(encoding="utf-8"), set(files))
            if what is not None and module not in faces and what not in own[module]]


def test_names_are_imported_from_their_home():
    """sweep.store once passed on sweep.keys' names (result_key, normalized_options, Failure), cli.options
    selection's parse_indices, edits.apply edits.names' Edit, model.scoring requests' Text: one home a name."""
    assert not borrowed()


def test_the_home_check_sees_a_borrowed_name(tmp_path):
    (tmp_path / "keys.py").write_text("def result_key():\n    pass\nif True:\n    KIND = 1\n")
    (tmp_path / "store.py").write_text("from pkg.keys import result_key\n")
    (tmp_path / "engine.py").write_text("def f():\n    from pkg.store import result_key\n")
    (tmp_path / "other.py").write_text("from pkg.keys import KIND, result_key\n")
    assert borrowed(tmp_path, "pkg") == ["pkg.engine imports result_key from pkg.store"]


SHARED_DRAWING = tuple(f"qkinspect.report.{m}" for m in ("style", "heatmap", "grid", "titles", "pages", "tables"))


def reading_records(edges: dict[str, set[str]], shared: tuple[str, ...], package: str = "qkinspect") -> dict:
    """module -> what it imports of the package beyond the shared pieces, for each shared piece."""
    return {name: sorted(d for d in edges[name] if d.startswith(package) and d not in shared)
            for name in shared if any(d.startswith(package) and d not in shared for d in edges.get(name, ()))}


def test_the_shared_drawing_pieces_read_no_subjects_records():
    """report/ by subject over the shared pieces: style, heatmap and its grid, titles, pages and their tables serve
    the analysis, the experiment, the sweep and the atlas alike, so they import nothing of the package but each
    other (report.grid once read AnalysisResult for the analysis alone; report.tables built its per-layer tables)."""
    assert not reading_records(package_graph(), SHARED_DRAWING)
    old = {"qkinspect.report.grid": {"qkinspect.records", "qkinspect.report.style"}}  # the tree before the move
    assert reading_records(old, ("qkinspect.report.grid", "qkinspect.report.style")) == {
        "qkinspect.report.grid": ["qkinspect.records"]}


# -- one floor plan for every capability (issue 38) -------------------------------------------------------------
# Each check below names, where the files the composition, directions and atlas work still hold (moved in phase 2
# of issue 38) break it, today's offenders exactly: the list may shrink, never grow, and an entry that no longer
# offends fails the check too, so that the list stays the truth.


def exactly(found: set[str] | list[str], allowed: set[str], what: str) -> None:
    """`found` must be `allowed`: nothing new, and nothing allowed that no longer offends (strike it)."""
    found = set(found)
    new, gone = sorted(found - allowed), sorted(allowed - found)
    assert not new, f"{what}: {new}"
    assert not gone, f"{what}: these no longer offend, strike them from the allow-list: {gone}"


def room(name: str, package: str = "qkinspect") -> str | None:
    """The package a module belongs to for the package-level check: `qkinspect.sweep.store` -> `qkinspect.sweep`;
    a root module is its own package; the package face (and the entry point) is no room."""
    parts = name.split(".")
    if name in (package, f"{package}.__main__"):
        return None
    return ".".join(parts[:2])


def package_cycles(edges: dict[str, set[str]], package: str = "qkinspect") -> list[list[str]]:
    """The strongly connected components of more than one package, each sorted, with the import edges between
    modules lifted to their packages (`room`)."""
    lifted: dict[str, set[str]] = {}
    for name, deps in edges.items():
        a = room(name, package)
        if a is None:
            continue
        lifted.setdefault(a, set())
        lifted[a] |= {b for d in deps if (b := room(d, package)) not in (None, a)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(lifted.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(lifted):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_import_cycle_between_packages():
    """Counted by package (a root module as its own), nine packages once sat in one strongly connected component:
    experiment.results -> terminal.experiment -> report.rho -> experiment.rank_interval, records -> terminal.tables,
    ... The module-level check cannot see such a loop."""
    assert not package_cycles(package_graph())


def test_the_package_cycle_check_sees_a_loop_through_packages(tmp_path):
    """Today's shape in small: no module circle, yet experiment -> terminal -> report -> experiment."""
    for sub in ("experiment", "terminal", "report"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "__init__.py").write_text("")
    (tmp_path / "__init__.py").write_text("from pkg.experiment import results\n")  # the face: no room
    (tmp_path / "experiment" / "results.py").write_text("def f():\n    from pkg.terminal import experiment\n")
    (tmp_path / "terminal" / "experiment.py").write_text("from pkg.report import rho\n")
    (tmp_path / "report" / "rho.py").write_text("from pkg.experiment import rank_interval\n")
    (tmp_path / "experiment" / "rank_interval.py").write_text("import math\n")
    order(package_graph(tmp_path, "pkg"))  # no circle between modules
    assert package_cycles(package_graph(tmp_path, "pkg")) == [["pkg.experiment", "pkg.report", "pkg.terminal"]]
    (tmp_path / "rho.py").write_text("import math\n")  # the ρ words as one ground module below both
    (tmp_path / "report" / "rho.py").write_text("from pkg import rho\n")
    (tmp_path / "terminal" / "experiment.py").write_text("from pkg import rho\n")
    assert package_cycles(package_graph(tmp_path, "pkg")) == []


def commands_importing_commands(folder: Path = PACKAGE, package: str = "qkinspect") -> set[str]:
    """'a -> b' for each CLI command module that imports another (anywhere: functions included)."""
    prefix = f"{package}.cli.commands."
    return {f"{name} -> {m}" for name, deps in package_graph(folder, package).items() if name.startswith(prefix)
            for m in deps if m.startswith(prefix) and m != name}


# none left: what plot and report share lives in cli/model_argument.py (phase 2 of issue 38)
COMMANDS_IMPORTING_COMMANDS: set[str] = set()


def test_no_cli_command_imports_another():
    """Every command is option declarations, one library call and `emit`; what commands share lives in cli/
    modules that are not commands (report -> plot, atlas -> sweep, plot -> composition, sweep -> analyze and
    directions -> sweep once did)."""
    exactly(commands_importing_commands(), COMMANDS_IMPORTING_COMMANDS, "a command imports another command")


def test_the_command_check_sees_one_command_importing_another(tmp_path):
    (tmp_path / "cli" / "commands").mkdir(parents=True)
    for p in ("cli/__init__.py", "cli/commands/__init__.py", "cli/output.py"):
        (tmp_path / p).write_text("")
    (tmp_path / "cli" / "commands" / "sweep.py").write_text("from pkg.cli.output import emit\n")
    (tmp_path / "cli" / "commands" / "atlas.py").write_text("def f():\n    from pkg.cli.commands.sweep import w\n")
    assert commands_importing_commands(tmp_path, "pkg") == {"pkg.cli.commands.atlas -> pkg.cli.commands.sweep"}


TABLE_PIECES = {"rich.table", "rich.table.Table", "rich.table.Column", "rich.box"}
TERMINAL_TABLE_PIECES = {"Column", "fit_tables", "head_table"}  # qkinspect.terminal.tables' building blocks
HELP_SCREEN = "qkinspect.cli.help_render"  # the CLI's own --help screen (a layout grid), not a result's table


def tables_built_under_cli(folder: Path = PACKAGE, package: str = "qkinspect") -> set[str]:
    """The modules under cli/ (not the help screen) that build a table for people: importing rich's Table or box,
    or terminal.tables' columns and fitting (the tables belong in terminal/<subject>.py)."""
    files = modules(folder, package)
    bad = set()
    for name, p in files.items():
        if not name.startswith(f"{package}.cli") or name == HELP_SCREEN.replace("qkinspect", package, 1):
            continue
        source = p.read_text(encoding="utf-8")
        if any(set(names) & TABLE_PIECES for names in imported_names(source)):
            bad.add(name)
        terminal = f"{package}.terminal.tables"
        if any(m == terminal and what in TERMINAL_TABLE_PIECES for m, what in imported(source, set(files))):
            bad.add(name)
    return bad


# none left: every table is built in terminal/<subject>.py (phase 2 of issue 38 moved atlas', composition's and
# directions' there)
TABLES_UNDER_CLI: set[str] = set()


def test_no_rich_table_is_built_under_cli():
    """A result's table for people is the library's (terminal/<subject>.py), shown in a notebook too; the CLI
    only chooses it (directions built its rich table in the command; atlas, composition, spectrum, compare and
    info assembled theirs there)."""
    exactly(tables_built_under_cli(), TABLES_UNDER_CLI, "a table is built under cli/")


def test_the_table_check_sees_a_table_built_in_a_command(tmp_path):
    (tmp_path / "cli" / "commands").mkdir(parents=True)
    (tmp_path / "terminal").mkdir()
    for p in ("cli/__init__.py", "cli/commands/__init__.py", "terminal/__init__.py"):
        (tmp_path / p).write_text("")
    (tmp_path / "terminal" / "tables.py").write_text("def fit_tables():\n    pass\nColumn = 1\n")
    (tmp_path / "cli" / "commands" / "info.py").write_text("def f():\n    from pkg.terminal.tables import Column\n")
    (tmp_path / "cli" / "commands" / "dirs.py").write_text("def f():\n    from rich.table import Table\n")
    (tmp_path / "cli" / "commands" / "ok.py").write_text("from pkg.terminal.tables import print_lines\n")
    assert tables_built_under_cli(tmp_path, "pkg") == {"pkg.cli.commands.info", "pkg.cli.commands.dirs"}


LIBRARY_WORK = ("torch", "numpy", "safetensors", "struct")  # tensors and byte formats: the library's work
READING_LAYERS = ("plan", "layers")  # an opened model's layer plan and stream: reading weights is the library's


def library_work_under_cli(folder: Path = PACKAGE, package: str = "qkinspect") -> set[str]:
    """'module imports x' for each module under cli/ that imports tensor or file-format machinery (torch, numpy,
    safetensors, struct), anywhere, and 'module reads layers' for each that walks an opened model's layers
    (`m.plan(...)`, `m.layers(...)`): writing a safetensors file, computing on arrays or streaming a model's
    weights is library work."""
    bad = set()
    for name, p in modules(folder, package).items():
        if not name.startswith(f"{package}.cli"):
            continue
        source = p.read_text(encoding="utf-8")
        for names in imported_names(source):
            top = names[0].split(".")[0]
            if top in LIBRARY_WORK:
                bad.add(f"{name} imports {top}")
        if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in READING_LAYERS
               for n in ast.walk(ast.parse(source))):
            bad.add(f"{name} reads layers")
    return bad


def test_no_library_work_under_cli():
    """cli/safetensors_writer.py and extract_heads (which streamed the model's layers into it) were library work
    living in cli/ (bench and tests called them there); the spectrum's arrays were computed in its command."""
    exactly(library_work_under_cli(), set(), "library work under cli/")


def test_the_library_work_check_sees_a_writer_under_cli(tmp_path):
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "__init__.py").write_text("")
    (tmp_path / "cli" / "writer.py").write_text("import struct\ndef f():\n    import torch\n")
    (tmp_path / "cli" / "output.py").write_text("import json\n")
    (tmp_path / "cli" / "extract.py").write_text("def f(m):\n    for layer in m.layers(None, None):\n        pass\n")
    assert library_work_under_cli(tmp_path, "pkg") == {"pkg.cli.writer imports struct", "pkg.cli.writer imports torch",
                                                       "pkg.cli.extract reads layers"}


def definitions(pattern, folder: Path = PACKAGE, package: str = "qkinspect") -> set[str]:
    """'module.name' for each module-level name that `pattern` (a predicate on the name) accepts, defined (not
    imported) in a module of the package."""
    return {f"{name}.{n}" for name, p in modules(folder, package).items()
            for n in defined(p.read_text(encoding="utf-8")) if pattern(n)}


# each defined once, in its ground module (phase 2 of issue 38 moved the composition's and the directions' there)
SCAFFOLDING = {
    "PRECISIONS": ({"qkinspect.processing.PRECISIONS"}, set()),
    "Processing": ({"qkinspect.processing.Processing", "qkinspect.processing.CompositionProcessing"}, set()),
    "Names": ({"qkinspect.names.Names"}, set()),
}


@pytest.mark.parametrize("what", sorted(SCAFFOLDING))
def test_the_shared_scaffolding_is_defined_once(what):
    """`PRECISIONS` was written in three modules, `Processing` in two, a names type in two (experiment.requests'
    Names, sweep.names' EngineNames): one ground module each. A names type is any class named *Names."""
    home, offenders = SCAFFOLDING[what]
    if what == "PRECISIONS":
        found = definitions(lambda n: n == "PRECISIONS")
    elif what == "Processing":
        found = definitions(lambda n: n.endswith("Processing") and n[:1].isupper())
    else:
        found = names_types()
    exactly(found, home | offenders, f"{what} defined more than once")


def names_types(folder: Path = PACKAGE, package: str = "qkinspect") -> set[str]:
    """'module.Class' for each class that says how the caller spells an option (it has a `said` method)."""
    return {f"{name}.{node.name}" for name, p in modules(folder, package).items()
            for node in ast.parse(p.read_text(encoding="utf-8")).body if isinstance(node, ast.ClassDef)
            and any(isinstance(f, ast.FunctionDef) and f.name == "said" for f in node.body)}


def test_the_definition_check_sees_a_second_names_type(tmp_path):
    said = "    def said(self, option, value):\n        pass\n"
    (tmp_path / "names.py").write_text("class Names:\n" + said)
    (tmp_path / "engine.py").write_text("from pkg.names import Names\nclass EngineNames:\n" + said)
    (tmp_path / "vocab.py").write_text("class VocabNames:\n    pass\nPRECISIONS = {}\n")
    assert names_types(tmp_path, "pkg") == {"pkg.names.Names", "pkg.engine.EngineNames"}
    assert definitions(lambda n: n == "PRECISIONS", tmp_path, "pkg") == {"pkg.vocab.PRECISIONS"}


# The capability packages (qkinspect.capabilities' entries, heads and extract included): every document or manifest
# they read back goes through the house's reader (qkinspect.reading: bounded in size and depth, a regular file, one
# line naming the file). Checkpoint descriptions are loading/'s, read through the same reader.
CAPABILITY_PACKAGES = ("analysis", "atlas", "composition", "directions", "experiment", "extract", "heads", "sweep",
                       "twin")
JSON_PARSERS = {"load", "loads"}


def json_parsed(folder: Path = PACKAGE, packages: tuple[str, ...] = CAPABILITY_PACKAGES) -> list[str]:
    """`module:line` for each json.load / json.loads call (or `from json import load[s]`) in the packages."""
    found = []
    for name in packages:
        for path in sorted((folder / name).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                called = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    isinstance(node.func.value, ast.Name) and node.func.value.id == "json" and \
                    node.func.attr in JSON_PARSERS
                imported = isinstance(node, ast.ImportFrom) and node.module == "json" and \
                    any(a.name in JSON_PARSERS for a in node.names)
                if called or imported:
                    found.append(f"{path.relative_to(folder)}:{node.lineno}")
    return found


def test_no_capability_parses_json_outside_the_house_reader():
    exactly(json_parsed(), set(), "JSON parsed outside qkinspect.reading")


def test_the_json_check_sees_a_load_and_an_imported_loads(tmp_path):
    (tmp_path / "twin").mkdir()
    (tmp_path / "twin" / "saved.py").write_text("import json\n\ndef f(p):\n    return json.load(open(p))\n")
    (tmp_path / "twin" / "other.py").write_text("from json import loads\n")
    assert json_parsed(tmp_path, ("twin",)) == ["twin/other.py:1", "twin/saved.py:4"]


# -- analysis on the floor plan (issue 43) -----------------------------------------------------------------------

FLOORS = ("loading", "metrics")  # opening models and resolving metrics: the library's, behind its calls


def floors_under_cli(folder: Path = PACKAGE, package: str = "qkinspect") -> set[str]:
    """'module imports x' for each module under cli/ that imports `package`.loading or `package`.metrics (or below
    them) in any form: `import`, `from ... import` (`from pkg import loading` too), at module level or inside a
    function, or `importlib.import_module("...")` / `__import__("...")` with the name written out."""
    floors = tuple(f"{package}.{f}" for f in FLOORS)

    def is_floor(name: str) -> bool:
        return any(name == f or name.startswith(f + ".") for f in floors)

    bad = set()
    for name, p in modules(folder, package).items():
        if not (name == f"{package}.cli" or name.startswith(f"{package}.cli.")):
            continue
        for names in imported_names(p.read_text(encoding="utf-8")):
            hit = next((n for n in names if is_floor(n)), None)  # `from x.y import f`: x.y, once
            if hit is not None:
                bad.add(f"{name} imports {hit}")
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and \
                    isinstance(node.args[0].value, str) and is_floor(node.args[0].value):
                f = node.func
                called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
                if called in ("import_module", "__import__"):
                    bad.add(f"{name} imports {node.args[0].value}")
    return bad


# none: every command is options, one library call (qkinspect.analysis' analyze, compare, spectrum, model_info ...)
# and emit; before issue 43, cli/run.py, cli/options.py, cli/model_argument.py and the compare, spectrum, plot and
# info commands opened models or resolved metrics themselves
FLOORS_UNDER_CLI: set[str] = set()


def test_nothing_under_cli_imports_loading_or_metrics():
    """The CLI declares options and chooses the output; opening a model (loading/) and resolving a metric (metrics/)
    are the library's, behind its calls, so that the library checks a request once, in the caller's names (one
    `--layers` value was once checked three times on one call: in cli/options, cli/run and the library)."""
    exactly(floors_under_cli(), FLOORS_UNDER_CLI, "cli/ imports loading or metrics")


def test_the_floor_check_sees_every_import_form(tmp_path):
    (tmp_path / "cli" / "commands").mkdir(parents=True)
    for p in ("cli/__init__.py", "cli/commands/__init__.py", "cli/output.py"):
        (tmp_path / p).write_text("")
    (tmp_path / "cli" / "run.py").write_text("def f():\n    from pkg.loading import LoadedModel, open_model\n")
    (tmp_path / "cli" / "options.py").write_text("from pkg import metrics\nimport pkg.metrics.registry as r\n")
    (tmp_path / "cli" / "commands" / "plot.py").write_text(
        "import importlib\ndef f():\n    return importlib.import_module('pkg.metrics.registry')\n")
    (tmp_path / "cli" / "commands" / "info.py").write_text("from pkg.analysis.info import model_info\n")
    assert floors_under_cli(tmp_path, "pkg") == {
        "pkg.cli.run imports pkg.loading", "pkg.cli.options imports pkg.metrics",
        "pkg.cli.options imports pkg.metrics.registry", "pkg.cli.commands.plot imports pkg.metrics.registry"}
