"""The atlas as a user runs it: `qkinspect atlas` in a process of its own on its local Dask cluster, killed
mid-run and run again; and every model of a Hugging Face cache folder, offline."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.atlas.conftest import NEEDS_DASK, save_zoo

pytest.importorskip("distributed", reason=NEEDS_DASK)

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), "COLUMNS": "80"}


def qkinspect(*args, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qkinspect", *map(str, args)], capture_output=True, text=True,
                          env={**ENV, **(env or {})}, timeout=timeout)


@pytest.fixture(scope="module")
def slow_zoo(tmp_path_factory) -> list[Path]:
    """Six models of three families that take a few seconds each with every metric: caught in the middle."""
    root = tmp_path_factory.mktemp("slow_zoo")
    return [p for k in range(2) for p in save_zoo(root / f"set{k}", scale=6).values()]


def test_killed_atlas_resumes_without_recomputing(slow_zoo, tmp_path):
    out = tmp_path / "out"
    args = ["atlas", *slow_zoo, "--out", out, "--metrics", "all", "--workers", "1", "-f", "csv"]
    proc = subprocess.Popen([sys.executable, "-m", "qkinspect", *map(str, args)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=ENV, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not list(out.glob("models/results/*.json")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the command, its scheduler and its worker: a power cut, not Ctrl-C
        proc.wait(30)
    kept = {p: p.stat().st_mtime_ns for p in out.glob("models/results/*.json")}
    assert 1 <= len(kept) < 6
    r = qkinspect(*args)
    assert r.returncode == 0, r.stderr
    assert f"note: {6 - len(kept)} computed, {len(kept)} already in {out}" in r.stderr
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # the kept results were not computed again
    lines = r.stdout.splitlines()
    assert lines[0] == "model,block,metric,scope,layer,depth,median,q1,q3,n,chance,vs_chance,path"
    assert {line.split(",")[-1] for line in lines[1:]} == {str(p) for p in slow_zoo}


def fake_cache(root: Path, model: Path) -> Path:
    """A Hugging Face hub cache as huggingface_hub lays it out: one model repo (a snapshot of `model` under a
    40-hex commit, refs/main naming it), and a dataset repo that is not a model."""
    commit = "0123abcd" * 5
    for repo in ("models--org--tiny-bert", "datasets--org--texts"):
        snapshot = root / repo / "snapshots" / commit
        snapshot.mkdir(parents=True)
        (root / repo / "refs").mkdir()
        (root / repo / "refs" / "main").write_text(commit)
    for f in ("config.json", "model.safetensors"):
        shutil.copy(model / f, root / "models--org--tiny-bert" / "snapshots" / commit / f)
    (root / "datasets--org--texts" / "snapshots" / commit / "data.txt").write_text("text\n")
    return root


def test_hf_cache_models_are_discovered_and_analysed_offline(zoo, tmp_path):
    from qkinspect.atlas import hf_cache_models

    cache = fake_cache(tmp_path / "hub", zoo["bert"])
    assert hf_cache_models(cache) == ["org/tiny-bert"]
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    r = qkinspect("atlas", "--hf-cache", zoo["bart"], "--out", tmp_path / "out", "--metrics", "symmetry",
                  "--workers", "1", "-f", "json", env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["paths"] == [str(zoo["bart"]), "org/tiny-bert"] and doc["models"] == ["bart", "org/tiny-bert"]
    import qkinspect as qk

    want = qk.analyze(zoo["bert"], metrics=["symmetry"]).heads
    got = next(x for x in doc["records"] if x["model"] == "org/tiny-bert" and x["scope"] == "model")
    assert got["n"] == len(want) and got["metric"] == "symmetry"
    r = qkinspect("atlas", "--hf-cache", "--out", tmp_path / "none", env={"HF_HUB_CACHE": str(tmp_path / "nope")})
    assert r.returncode == 2 and r.stderr.strip() == (
        f"error: --hf-cache: no Hugging Face cache at {tmp_path / 'nope'} (set HF_HUB_CACHE or HF_HOME)")
