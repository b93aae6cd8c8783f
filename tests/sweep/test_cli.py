"""`qkinspect sweep` on its default engine (a LocalCluster on this machine), and refusals before any work."""

from __future__ import annotations

import json
import os

import pytest

from tests.sweep.conftest import NEEDS_DASK, analyze_table, assert_same_table

pytest.importorskip("distributed", reason=NEEDS_DASK)


def test_the_local_cluster_gives_the_same_table(tiny_run, cli, tmp_path):
    r = cli("sweep", f"{tiny_run}/checkpoint-*", "--out", tmp_path / "out", "--workers", "2", "--metrics",
            "symmetry,qk_stable_rank", "--by", "layer", "-o", tmp_path / "t.ndjson")
    assert r.exit_code == 0, r.stderr
    rows = [json.loads(line) for line in (tmp_path / "t.ndjson").read_text().splitlines()]
    assert_same_table(rows, analyze_table(tiny_run, by="layer", metrics=["symmetry", "qk_stable_rank"]))
    assert "note: 6 computed, 0 already in" in r.stderr
    # two worker processes share the cores: workers x torch threads <= cores
    threads = {json.loads(p.read_text())["threads"] for p in (tmp_path / "out" / "results").glob("*.json")}
    assert threads == {max(1, len(os.sched_getaffinity(0)) // 2)}


@pytest.mark.parametrize("args, message", [
    (["--format", "parquet"], "--format parquet writes a file: give -o FILE.parquet"),
    (["-o", "table.xlsx"], "cannot tell the format from '.xlsx'"),
    (["--metrics", "nope"], "nope"),
    (["--workers", "0"], "--workers: 0 must be at least 1"),
    (["--workers", "2", "--scheduler", "tcp://127.0.0.1:9"], "--workers sizes the local cluster"),
    (["--layers", "7"], None),
])
def test_refused_before_any_work(tiny_run, cli, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    if message is None:  # a layer the checkpoints do not have: refused once the shapes are known, not per task
        message = "--layers: 7 is out of range; encoder has layers 0-1"
    r = cli("sweep", f"{tiny_run}/checkpoint-500", "--out", tmp_path / "out", *args)
    assert r.exit_code == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: ") and message in r.stderr
    assert not list((tmp_path / "out").glob("results/*"))
