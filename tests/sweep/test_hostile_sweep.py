"""Issue 25, class 6: a tampered sweep folder. The manifest and each result are checked whole where they enter,
and a result against the checkpoint and options it claims: `plot`/`report` refuse a bad file with one line naming
it (exit 2), a resumed sweep computes it again; nothing is written through a link or into a FIFO."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qkinspect.cli.app import app
from qkinspect.errors import InputError
from qkinspect.sweep import discover, keys, read_sweep, store, task
from qkinspect.sweep.verify import ResultRefused, check_manifest
from tests.one_line import one_error_line
from tests.sweep.conftest import NEEDS_DASK

OPTIONS = keys.normalized_options({"metrics": ["symmetry", "head_overlap"]})


def write_sweep(folder: Path, specs: list[str]) -> list:
    """A sweep folder as `qkinspect sweep` leaves it, computed in this process (no cluster): results + manifest."""
    cks = discover(specs)
    store.prepare(folder)
    for ck in cks:
        key = keys.result_key(ck, OPTIONS)
        payload = task.analyze_checkpoint(ck.spec, ck.revision, OPTIONS, threads=1)
        store.write_json(store.result_path(folder, ck, key), store.result_document(ck, key, OPTIONS, payload, "cpu"))
    store.write_manifest(folder, cks, OPTIONS)
    return cks


@pytest.fixture(scope="module")
def pristine(tiny_run, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hostile_sweep") / "sweep"
    write_sweep(folder, [str(tiny_run / "checkpoint-500"), str(tiny_run / "checkpoint-1000")])
    return folder


@pytest.fixture
def folder(pristine, tmp_path) -> Path:
    out = tmp_path / "sweep"
    shutil.copytree(pristine, out, symlinks=True)
    return out


def results(folder: Path) -> list[Path]:
    """The two result files, in step order (500, 1000)."""
    manifest = json.loads((folder / "sweep.json").read_text())
    return [folder / c["file"] for c in manifest["checkpoints"]]


def edit(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def test_the_pristine_folder_reads(pristine):
    sweep = read_sweep(pristine)
    assert len(sweep.results) == 2 and len(sweep.rows()) == 2 * 2 * 4


def copied_under_the_other_key(folder: Path) -> None:
    """checkpoint-500's result copied over checkpoint-1000's file, its key set to what the file name says."""
    a, b = results(folder)[:2]
    doc = json.loads(a.read_text())
    doc["key"] = json.loads(b.read_text())["key"]
    b.write_text(json.dumps(doc))


def forged_checkpoint(folder: Path) -> None:
    """The same, with the checkpoint record forged too: the analysis still describes checkpoint-500's files."""
    a, b = results(folder)
    doc, other = json.loads(a.read_text()), json.loads(b.read_text())
    doc["key"], doc["checkpoint"] = other["key"], other["checkpoint"]
    b.write_text(json.dumps(doc))


def set_in(path: str, value):
    def change(doc):
        *parents, last = path.split(".")
        node = doc
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        node[int(last) if isinstance(node, list) else last] = value

    return change


RESULT_CASES = {
    "model {}": (set_in("result.model", {}), r"result.model.name is None, not a string"),
    "model blocks empty": (set_in("result.model.blocks", []), r"result.model.blocks is an array, not a list"),
    "too many heads": (lambda doc: doc["result"]["heads"].extend(doc["result"]["heads"] * 2),
                       r"result.heads has 24 records, more than the model's shape allows \(8\)"),
    "heads not a list": (set_in("result.heads", {}), r"result.heads is an object, not a list of records"),
    "head layer past the model": (set_in("result.heads.0.layer", 2), r"result.heads\[0\].layer is 2, outside 0 .. 1"),
    "head block unknown": (set_in("result.heads.0.block", "x"), r"result.heads\[0\].block is \"x\", not a block"),
    "metric a string": (set_in("result.heads.0.symmetry", "high"), r"result.heads\[0\].symmetry is \"high\", not a"),
    "metric huge": (set_in("result.heads.0.symmetry", 1e300), r"result.heads\[0\].symmetry is 1e\+300, outside"),
    "overlap ragged": (set_in("result.layers.0.head_overlap.1", [1]),
                       r"result.layers\[0\].head_overlap\[1\] is an array, not 4 numbers"),
    "baseline mean": (set_in("result.baselines.0.mean", "x"), r"result.baselines\[0\].mean is \"x\", not a number"),
    "deep nesting": (set_in("result.warnings", json.loads("[" * 100 + "]" * 100)), "nested more than 64 levels"),
    "key": (set_in("key", "0000000000000000"), r"key is \"0000000000000000\", not [0-9a-f]{16}"),
    "kind": (set_in("kind", "analyze"), "not a qkinspect sweep result"),
    "options": (set_in("options.precision", "float64"), "options are not this sweep's options"),
    "not an object": (lambda doc: doc.clear(), "not a qkinspect sweep result"),
}


@pytest.mark.parametrize("case", list(RESULT_CASES))
def test_a_bad_result_is_refused_naming_the_file(folder, case):
    change, message = RESULT_CASES[case]
    _, b = results(folder)
    edit(b, change)
    with pytest.raises(ResultRefused, match=f"^{b}: .*{message}" if case == "deep nesting" else f"^{b}: {message}"):
        read_sweep(folder)


@pytest.mark.parametrize(("tamper", "message"), [
    (copied_under_the_other_key, r"checkpoint.spec is \".*checkpoint-500\": the result is not of .*checkpoint-1000"),
    (forged_checkpoint, r"result.model.source is \".*checkpoint-500\": the result is not of .*checkpoint-1000"),
])
def test_a_result_of_another_checkpoint_is_refused(folder, tamper, message):
    tamper(folder)
    with pytest.raises(ResultRefused, match=message):
        read_sweep(folder)


def test_a_checkpoint_rewritten_since_is_not_trusted(folder, tiny_run, tmp_path):
    """The identity holds the files' sizes and times: a result of the old files is not one of the new ones."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run / "checkpoint-500", run / "checkpoint-500")
    out = tmp_path / "s2"
    (ck,) = write_sweep(out, [str(run / "checkpoint-500")])
    os.utime(run / "checkpoint-500" / "model.safetensors", ns=(1, 1))
    (now,) = discover([str(run / "checkpoint-500")])
    assert now.identity != ck.identity
    key = keys.result_key(now, OPTIONS)
    old = store.result_path(out, ck, keys.result_key(ck, OPTIONS))
    shutil.copy(old, store.result_path(out, now, key))  # filed under the new key: still the old files' result
    with pytest.raises(ResultRefused, match="key is .*, not"):
        store.load_result(out, now, key, OPTIONS)


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "link to a good file", "folder"])
def test_result_files_that_are_not_regular(folder, kind):
    a, b = results(folder)
    b.unlink()
    if kind == "fifo":
        os.mkfifo(b)
    elif kind == "/dev/zero":
        b.symlink_to("/dev/zero")
    elif kind == "link to a good file":
        b.symlink_to(a)
    else:
        b.mkdir()
    with pytest.raises(ResultRefused, match=f"^{b}: is a (link|FIFO|folder)"):
        read_sweep(folder)


MANIFEST_CASES = {
    "checkpoints not a list": (set_in("checkpoints", {}), r"checkpoints is an object, not a list of checkpoints"),
    "step a string": (set_in("checkpoints.0.step", "500"), r"checkpoints\[0\].step is \"500\", not a whole number"),
    "spec a number": (set_in("checkpoints.0.spec", 5), r"checkpoints\[0\].spec is 5, not a string"),
    "step source": (set_in("checkpoints.0.step_source", "x"), r"checkpoints\[0\].step_source is \"x\", not one of"),
    "key of another": (set_in("checkpoints.0.key", "0123456789abcdef"), r"checkpoints\[0\].key is \"0123456789abcdef\""
                                                                        r", not the key of"),
    "options unknown": (set_in("options.x", 1), "options hold unknown x"),
    "options type": (set_in("options.fold_ln", "yes"), r"options.fold_ln is \"yes\", not true or false"),
    "layers type": (set_in("options.layers", [0, "1"]), r"options.layers\[1\] is \"1\", not a whole number"),
    "failures": (set_in("failures", [{"checkpoint": 1}]), r"failures\[0\].checkpoint is 1, not a string"),
    "kind": (set_in("kind", "x"), "not a qkinspect sweep manifest"),
    "deep": (set_in("failures", json.loads("[" * 80 + "]" * 80)), "nested more than 64 levels"),
}


@pytest.mark.parametrize("case", list(MANIFEST_CASES))
def test_a_bad_manifest_is_refused(folder, case):
    change, message = MANIFEST_CASES[case]
    edit(folder / "sweep.json", change)
    with pytest.raises(InputError, match=message):
        read_sweep(folder)


@pytest.mark.parametrize("case", ["model {}", "deep nesting", "copied", "manifest"])
def test_plot_and_report_exit_2(folder, tmp_path, case):
    if case == "copied":
        copied_under_the_other_key(folder)
    elif case == "manifest":
        edit(folder / "sweep.json", MANIFEST_CASES["step a string"][0])
    else:
        edit(results(folder)[1], RESULT_CASES[case][0])
    named = folder / "sweep.json" if case == "manifest" else results(folder)[1]
    for args in (["plot", folder, "--kind", "trajectory", "-o", tmp_path / "t.png"],
                 ["report", folder, "-o", tmp_path / "r.pdf"], ["report", folder, "--html", "-o", tmp_path / "r.html"]):
        line = one_error_line(CliRunner().invoke(app, [str(a) for a in args]))
        assert line.startswith(f"error: {named}: "), line
    assert not [p for p in tmp_path.iterdir() if p.name != "sweep"]


# -- resuming: what is refused is computed again, never written through ----------------------------------------


def test_resume_computes_refused_results_again(tiny_run, tmp_path):
    pytest.importorskip("distributed", reason=NEEDS_DASK)
    specs = [str(tiny_run / f"checkpoint-{s}") for s in (500, 1000, 1500, 2000)]
    folder = tmp_path / "sweep"
    write_sweep(folder, specs)
    files = results(folder)
    good = {f: json.loads(f.read_text()) for f in files}
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    # 1000: checkpoint-500's result under its key; 1500: model {}; 2000: a link out of the folder; 500: a FIFO
    copied_under_the_other_key(folder)
    edit(files[2], set_in("result.model", {}))
    files[3].unlink()
    files[3].symlink_to(outside)
    files[0].unlink()
    os.mkfifo(files[0])
    r = CliRunner().invoke(app, ["sweep", *specs, "--out", str(folder), "--metrics", "symmetry,head_overlap",
                                 "--workers", "1", "-f", "json"])
    assert r.exit_code == 0, r.stderr
    lines = r.stderr.splitlines()
    notes = [i for i, line in enumerate(lines) if line.endswith("; computing it again")]
    assert len(notes) == 4, r.stderr
    assert max(notes) < min(i for i, line in enumerate(lines) if line.startswith("sweep: "))  # said before the work
    assert "4 computed, 0 already in" in r.stderr
    assert outside.read_text() == "keep me"  # the link was replaced, not written through
    for f in files:
        assert f.is_file() and not f.is_symlink()
        doc = json.loads(f.read_text())
        assert doc["checkpoint"] == good[f]["checkpoint"] and doc["result"]["heads"] == good[f]["result"]["heads"]
    assert len(json.loads(r.stdout)["heads"]) == 4 * 2 * 4


def test_a_stored_result_with_model_braces_does_not_crash_a_resume(folder, monkeypatch):
    """Every checkpoint 'done', one with `model: {}`: refused and computed again (not a KeyError)."""
    pytest.importorskip("distributed", reason=NEEDS_DASK)
    from qkinspect.sweep import engine

    edit(results(folder)[1], set_in("result.model", {}))
    manifest = json.loads((folder / "sweep.json").read_text())
    cks = [c for c, _ in check_manifest(manifest, folder / "sweep.json")[0]]
    stored, refused = engine._stored(folder, [(ck, key, store.result_path(folder, ck, key)) for ck in cks
                                              for key in [keys.result_key(ck, OPTIONS)]], OPTIONS)
    assert len(stored) == 1 and len(refused) == 1 and "result.model.name is None" in refused[0]

