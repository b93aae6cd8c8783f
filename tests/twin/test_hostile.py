"""The twin given hostile input (issue 44): each is one line naming the file or the option (exit 2; InputError from
Python), before any work where it can be, nothing read outside the given paths, bounded in time and memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import qkinspect
from qkinspect.cli.app import app
from qkinspect.errors import InputError
from qkinspect.twin.saved import read_twin
from tests.one_line import one_error_line
from tests.twin.conftest import TINY, text_file

ROOT = Path(__file__).resolve().parents[2]
CLI_TINY = ["--layers", "1", "--d-model", "16", "--heads", "2", "--context", "8", "--batch", "2", "--eval-windows",
            "4", "--steps", "2", "--seeds", "1", "--workers", "0"]


def twin(*args):
    return CliRunner().invoke(app, ["twin", *map(str, args)])


@pytest.fixture(scope="module")
def done_folder(tmp_path_factory):
    """A finished twin folder (standard and share_qk, one seed) and its text."""
    tmp = tmp_path_factory.mktemp("done")
    text = text_file(tmp / "t.txt", 2000)
    r = twin("--out", tmp / "out", "--text", text, *CLI_TINY, "-f", "json")
    assert r.exit_code == 0, r.stderr
    return tmp / "out", text


def _copy(folder: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(folder, to, symlinks=True)
    return to


def test_a_link_in_the_text_folder_to_a_file_outside_it_is_refused(tmp_path):
    (tmp_path / "texts").mkdir()
    text_file(tmp_path / "texts" / "a.txt", 2000)
    secret = text_file(tmp_path / "secret.txt", 2000)
    (tmp_path / "texts" / "b.txt").symlink_to(secret)
    line = one_error_line(twin("--out", tmp_path / "out", "--text", tmp_path / "texts", *CLI_TINY), "--text",
                          "b.txt", "outside the folder")
    assert str(secret) in line and not (tmp_path / "out").exists()
    with pytest.raises(InputError, match="text=.*b.txt.*outside the folder"):
        qkinspect.twin(tmp_path / "out2", text=tmp_path / "texts", seeds=1, steps=1, **TINY)


def test_a_link_inside_the_text_folder_to_a_file_inside_it_is_read(tmp_path):
    (tmp_path / "texts").mkdir()
    text_file(tmp_path / "texts" / "a.txt", 2000)
    (tmp_path / "texts" / "b.txt").symlink_to(tmp_path / "texts" / "a.txt")
    result = qkinspect.twin(tmp_path / "out", text=tmp_path / "texts", variants="standard", seeds=1, steps=1,
                            **TINY)
    assert result.setup["text"]["files"] == ["a.txt", "b.txt"]


@pytest.mark.parametrize("what", ["fifo", "dev_zero"])
def test_a_text_that_is_a_device_or_fifo_is_refused_unread(tmp_path, what):
    (tmp_path / "texts").mkdir()
    text_file(tmp_path / "texts" / "a.txt", 2000)
    if what == "fifo":
        os.mkfifo(tmp_path / "texts" / "b.txt")  # no writer: an open would block
        target = tmp_path / "texts" / "b.txt"
    else:
        target = tmp_path / "zero.txt"
        target.symlink_to("/dev/zero")
    given = tmp_path / "texts" if what == "fifo" else target
    one_error_line(twin("--out", tmp_path / "out", "--text", given, *CLI_TINY), "--text", target.name,
                   "not a regular file")


@pytest.mark.parametrize("target", ["outside", "/dev/zero", "fifo"])
def test_a_run_file_that_is_a_link_or_not_a_file_is_refused(tmp_path, done_folder, target):
    folder, text = done_folder
    out = _copy(folder, tmp_path / "out")
    run = out / "runs" / "share_qk-s0-lr0.001.json"
    run.unlink()
    if target == "outside":
        (tmp_path / "elsewhere.json").write_text((folder / "runs" / run.name).read_text())
        run.symlink_to(tmp_path / "elsewhere.json")
    elif target == "fifo":
        os.mkfifo(run)
    else:
        run.symlink_to(target)
    with pytest.raises(InputError, match="share_qk-s0-lr0.001.json"):
        read_twin(out)  # never opened: a link is refused by what it is, /dev/zero never read
    one_error_line(twin("--out", out, "--text", text, *CLI_TINY), "share_qk-s0-lr0.001.json")
    one_error_line(CliRunner().invoke(app, ["plot", str(out), "-o", str(tmp_path / "f.png")]),
                   "share_qk-s0-lr0.001.json")


def test_a_manifest_that_is_a_link_is_refused(tmp_path, done_folder):
    folder, text = done_folder
    out = _copy(folder, tmp_path / "out")
    (tmp_path / "m.json").write_text((out / "twin.json").read_text())
    (out / "twin.json").unlink()
    (out / "twin.json").symlink_to(tmp_path / "m.json")
    with pytest.raises(InputError, match="twin.json: is a link"):
        read_twin(out)
    one_error_line(twin("--out", out, "--text", text, *CLI_TINY), "twin.json", "link")


def test_a_token_stream_or_checkpoint_link_is_replaced_never_written_through(tmp_path, small_text):
    out = tmp_path / "out"
    args = ["--out", out, "--text", small_text, *CLI_TINY, "--variants", "share_qk", "--save-checkpoints", "-f",
            "json"]
    assert twin(*args).exit_code == 0
    victim, elsewhere = tmp_path / "victim.txt", tmp_path / "elsewhere"
    victim.write_text("keep me")
    elsewhere.mkdir()
    for name in ("train.npy", "tokenizer.txt"):
        (out / "tokens" / name).unlink()
        (out / "tokens" / name).symlink_to(victim)
    import shutil

    shutil.rmtree(out / "checkpoints" / "share_qk-s0")
    (out / "checkpoints" / "share_qk-s0").symlink_to(elsewhere, target_is_directory=True)
    (out / "runs" / "share_qk-s0-lr0.001.json").unlink()  # trained again, with its checkpoint
    r = twin(*args)
    assert r.exit_code == 0, r.stderr
    assert victim.read_text() == "keep me" and not (out / "tokens" / "train.npy").is_symlink()
    assert not os.listdir(elsewhere) and not (out / "checkpoints" / "share_qk-s0").is_symlink()
    assert (out / "checkpoints" / "share_qk-s0" / "model.safetensors").is_file()


def test_a_config_that_is_a_link_to_a_device_is_refused(tmp_path):
    (tmp_path / "config.json").symlink_to("/dev/zero")
    one_error_line(twin("--out", tmp_path / "out", "--config", tmp_path / "config.json", *CLI_TINY), "--config",
                   "not a regular file")


@pytest.mark.parametrize("kind", ["sweep.json", "atlas.json", "notes.txt"])
def test_out_into_a_folder_of_something_else_is_refused(tmp_path, small_text, kind):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / kind).write_text("{}")
    says = {"sweep.json": "a sweep folder", "atlas.json": "an atlas folder", "notes.txt": "not a twin folder"}[kind]
    one_error_line(twin("--out", tmp_path / "out", "--text", small_text, *CLI_TINY), "--out", says)
    assert sorted(os.listdir(tmp_path / "out")) == [kind]  # nothing written


@pytest.mark.parametrize("args, says", [
    (["--lr", "1e-3,,3e-3"], ["--lr '1e-3,,3e-3'", "empty item"]),
    (["--lr", "1e-3,"], ["--lr", "empty item"]),
    (["--variants", ""], ["--variants ''", "no variant"]),
    (["--variants", "share_qk,,symmetric"], ["--variants", "empty item"]),
    (["--variants", " , "], ["--variants", "no variant"]),
])
def test_empty_items_are_refused(tmp_path, args, says):
    one_error_line(twin("--out", tmp_path / "out", *args), *says)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kw, names", [
    ({"out": object()}, "out="),
    ({"variants": 5}, "variants=5"),
    ({"variants": ["share_qk", 5]}, "variants="),
    ({"lr": object()}, "lr="),
    ({"text": 5}, "text=5"),
    ({"config": 2.0}, "config=2.0"),
    ({"tokenizer": None}, "tokenizer=None"),
    ({"arch": 1}, "arch=1"),
    ({"device": 0}, "device=0"),
    ({"scheduler": 8786}, "scheduler=8786"),
    ({"match_params": "yes"}, "match_params='yes'"),
    ({"save_checkpoints": 1}, "save_checkpoints=1"),
    ({"seeds": "2"}, "seeds='2'"),
    ({"progress": 5}, "progress=5"),
    ({"notice": "x"}, "notice='x'"),
])
def test_library_arguments_of_the_wrong_type_are_input_errors_naming_them(tmp_path, kw, names):
    kw = {"out": tmp_path / "out", "workers": 0, **kw}
    with pytest.raises(InputError) as e:
        qkinspect.twin(**kw)
    assert str(e.value).startswith(names) and "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()


_BLOCKED = """
import sys
sys.modules["dask"] = None
sys.modules["distributed"] = None
from qkinspect.cli.app import main
sys.argv = ["qkinspect", *sys.argv[1:]]
main()
"""


def _without_dask(tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "COLUMNS": "80"}
    return subprocess.run([sys.executable, "-c", _BLOCKED, "twin", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)


def test_workers_0_needs_no_dask_and_the_local_cluster_says_which_extra(tmp_path, small_text):
    base = ["--text", small_text, *CLI_TINY[:-2]]
    r = _without_dask(tmp_path, "--out", tmp_path / "a", *base, "--workers", "0", "--track-every", "1", "-f",
                      "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["kind"] == "twin"
    r = _without_dask(tmp_path, "--out", tmp_path / "b", *base)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'qkinspect[sweep]'" in lines[0] and "--workers 0" in lines[0], lines
    assert not (tmp_path / "b").exists()  # refused before anything is written


def test_the_twin_package_parses_no_json_of_its_own():
    """Every twin document and folder manifest is read through qkinspect.reading (bounded, regular files only):
    no module of the twin package calls json.load/json.loads or opens a file to read it itself."""
    import ast

    for path in sorted((ROOT / "qkinspect" / "twin").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                name = node.func.attr
                owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
                assert not (owner == "json" and name in ("load", "loads")), f"{path.name}:{node.lineno}: {name}"
                assert name not in ("read_text", "read_bytes"), f"{path.name}:{node.lineno}: {name}"
