"""The sweep on a real Dask cluster: a `dask scheduler` and `dask worker` processes on 127.0.0.1."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from tests.sweep.conftest import MEDIUM_OPTIONS, NEEDS_DASK, STEPS, analyze_table, assert_same_table

pytest.importorskip("distributed", reason=NEEDS_DASK)

METRICS = "symmetry,overlap,qk_effective_rank,directionality"


@pytest.fixture(scope="module")
def swept(cluster, tiny_run, tmp_path_factory):
    """One sweep of the six tiny checkpoints through --scheduler: (folder, CLI result)."""
    from typer.testing import CliRunner

    from qkinspect.cli.app import app

    out = tmp_path_factory.mktemp("sweep") / "out"
    r = CliRunner().invoke(app, ["sweep", f"{tiny_run}/checkpoint-*", "--scheduler", cluster.address, "--out",
                                 str(out), "--metrics", METRICS, "-f", "json"])
    return out, r


def test_table_equals_analyze_on_each_checkpoint(swept, tiny_run):
    out, r = swept
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["kind"] == "sweep" and [c["step"] for c in doc["checkpoints"]] == list(STEPS)
    assert_same_table(doc["heads"], analyze_table(tiny_run, metrics=METRICS.split(",")))
    assert "sweep: 6/6 done, 0 failed" in r.stderr and "ETA" in r.stderr
    assert "steps 500-3000 read from their names" in r.stderr
    from tests.cli.schema import validate

    validate(doc)
    docs = [validate(json.loads(p.read_text())) for p in (out / "results").glob("*.json")]
    assert len(docs) == 6
    # a worker runs one task at a time (--nthreads 1), so each task takes every core the worker may use
    assert {d["threads"] for d in docs} == {len(os.sched_getaffinity(0))}


def test_by_layer_and_parquet_from_the_folder(swept, tiny_run, cli, tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    out, _ = swept
    # every checkpoint is in the folder: nothing runs, the cluster is not even asked
    r = cli("sweep", f"{tiny_run}/checkpoint-*", "--out", out, "--metrics", METRICS, "--by", "layer",
            "-o", tmp_path / "t.parquet")
    assert r.exit_code == 0, r.stderr
    assert "0 computed, 6 already in" in r.stderr
    got = pd.read_parquet(tmp_path / "t.parquet").to_dict("records")
    expected = analyze_table(tiny_run, by="layer", metrics=METRICS.split(","))
    assert_same_table([{k: r[k] for k in e} for r, e in zip(got, expected, strict=True)], expected)


def test_other_options_are_other_results(swept, tiny_run, cluster, cli, tmp_path):
    import shutil

    out = shutil.copytree(swept[0], tmp_path / "out")  # the module's sweep folder stays as it was
    r = cli("sweep", f"{tiny_run}/checkpoint-1*", "--scheduler", cluster.address, "--out", out, "--metrics",
            "symmetry", "--layers", "1", "-f", "csv")
    assert r.exit_code == 0, r.stderr
    assert "2 computed, 0 already in" in r.stderr
    assert r.stdout.splitlines()[0] == "checkpoint,step,block,layer,head,kv_head,rank_q,rank_k,rank_v,symmetry"
    assert len(list((out / "results").glob("*.json"))) == 8


def test_a_killed_worker_loses_nothing(cluster, medium_run, tmp_path):
    """Kill a worker while it analyses a checkpoint: the scheduler runs that task elsewhere, every result arrives."""
    from distributed import Client

    from qkinspect.sweep import discover, read_sweep, run_sweep

    run = medium_run
    cluster.add_worker("doomed")
    cluster.wait_for_workers(3)
    options = MEDIUM_OPTIONS
    box = {}
    sweeper = threading.Thread(target=lambda: box.update(outcome=run_sweep(
        discover([f"{run}/checkpoint-*"]), options, tmp_path / "out", scheduler=cluster.address)))
    sweeper.start()
    with Client(cluster.address, timeout="10s") as client:
        doomed = next(a for a, w in client.scheduler_info(n_workers=-1)["workers"].items() if w["name"] == "doomed")
        deadline, lost = time.monotonic() + 60, []
        while not lost and time.monotonic() < deadline:
            lost = [k for k in client.processing([doomed]).get(doomed, ()) if str(k).startswith("qkinspect-analyze")]
            time.sleep(0.02)
        assert lost, "the doomed worker never ran an analysis"
        cluster.kill("doomed")
    sweeper.join(120)
    outcome = box["outcome"]
    assert outcome.failures == [] and len(outcome.computed) == 6
    sweep = read_sweep(tmp_path / "out")
    assert len(sweep.results) == 6
    key = str(lost[0]).split("-")[2]  # qkinspect-analyze-<result key>-<token>
    redone = next(doc for doc in sweep.results.values() if doc["key"] == key)
    assert redone["worker"] != doomed  # computed again by a surviving worker
    assert_same_table(sweep.rows(), analyze_table(run, **options))


def test_interrupted_sweep_resumes_without_recomputing(cluster, tiny_run, tmp_path):
    from qkinspect.sweep import discover, run_sweep

    checkpoints = discover([f"{tiny_run}/checkpoint-*"])
    options = {"metrics": ["symmetry"]}

    def ctrl_c_after_two(status):
        if status.done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(checkpoints, options, tmp_path / "out", scheduler=cluster.address, progress=ctrl_c_after_two)
    kept = {p: p.stat().st_mtime_ns for p in (tmp_path / "out" / "results").glob("*.json")}
    assert len(kept) == 2
    assert not list((tmp_path / "out" / "results").glob(".*"))  # no partial file left behind
    seen = []
    outcome = run_sweep(checkpoints, options, tmp_path / "out", scheduler=cluster.address, progress=seen.append)
    assert len(outcome.skipped) == 2 and len(outcome.computed) == 4 and outcome.failures == []
    assert [s.done for s in seen] == [3, 4, 5, 6] and all(s.skipped == 2 for s in seen)
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # the two kept results were not written again
    assert_same_table(outcome.read().rows(), analyze_table(tiny_run, metrics=["symmetry"]))


def test_different_shapes_are_refused_before_any_work(cluster, tiny_run, tmp_path, cli):
    from tests.cli.conftest import save_bert

    save_bert(tmp_path / "wide" / "checkpoint-9000", seed=5, hidden=64, heads=8)
    r = cli("sweep", f"{tiny_run}/checkpoint-500", f"{tiny_run}/checkpoint-1000", tmp_path / "wide/checkpoint-9000",
            "--scheduler", cluster.address, "--out", tmp_path / "out")
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: cannot sweep: attention shapes differ from {tiny_run}/checkpoint-500's: {tmp_path}/wide/"
        "checkpoint-9000 (encoder n_heads 4 vs 8; encoder n_kv_heads 4 vs 8; encoder d_model 32 vs 64)")
    assert not (tmp_path / "out").exists()  # nothing was written, not even the folder


def test_a_bad_checkpoint_is_recorded_and_the_rest_finish(cluster, tiny_run, tmp_path, cli):
    import shutil

    bad = tmp_path / "bad" / "checkpoint-4000"
    shutil.copytree(tiny_run / "checkpoint-3000", bad)
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])  # truncated
    r = cli("sweep", f"{tiny_run}/checkpoint-2*", bad, "--scheduler", cluster.address, "--out", tmp_path / "out",
            "--metrics", "symmetry", "-f", "ndjson")
    assert r.exit_code == 3  # checkpoints failed: neither bad input (2) nor a bug (1)
    assert r.stderr.strip().splitlines()[-1].startswith("error: 1 of 3 checkpoints failed")
    assert f"warning: failed: {bad}: " in r.stderr
    assert {json.loads(line)["step"] for line in r.stdout.splitlines()} == {2000, 2500}
    manifest = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert [f["checkpoint"] for f in manifest["failures"]] == [str(bad)]


def test_trajectory_figure_of_the_sweep(swept, cli, tmp_path):
    from tests.report.png import ink_fraction, png_size

    out, _ = swept
    r = cli("plot", out, "--kind", "trajectory", "--metric", "symmetry", "-o", tmp_path / "t.png")
    assert r.exit_code == 0, r.stderr
    assert png_size(tmp_path / "t.png")[0] == 1400 and ink_fraction(tmp_path / "t.png") > 0.02
    r = cli("plot", out, "--kind", "trajectory", "--metric", "cka_qv", "-o", tmp_path / "u.png")
    assert r.exit_code == 2
    assert r.stderr.strip() == ("error: --metric cka_qv: the sweep did not compute it; it has rank_q, rank_k, "
                                "rank_v, symmetry, directionality, qk_effective_rank, overlap_qk, "
                                "overlap_qv, overlap_kv")
    r = cli("plot", tmp_path, "--kind", "trajectory", "-o", tmp_path / "v.png")
    assert r.exit_code == 2 and "draws a sweep folder" in r.stderr and "has no sweep.json" in r.stderr


def test_the_trajectory_medians_are_the_rows_medians(swept):
    """The bold lines are the per-layer medians over heads at each step (read back from the drawn figure)."""
    import numpy as np

    from qkinspect.report.sweep.trajectory import trajectory
    from qkinspect.sweep import read_sweep

    rows = read_sweep(swept[0]).rows()
    fig = trajectory(rows, "symmetry", name="t")
    bold = [line for line in fig.axes[0].lines if line.get_linewidth() > 1]
    for layer, line in enumerate(bold):
        want = [np.median([r["symmetry"] for r in rows if r["layer"] == layer and r["step"] == s]) for s in STEPS]
        assert list(line.get_xdata()) == list(STEPS)
        assert np.allclose(line.get_ydata(), want)
    assert len(bold) == 2


@pytest.mark.slow
def test_ctrl_c_stops_cleanly_and_the_same_command_resumes(medium_run, cluster, cli, tmp_path):
    """A real SIGINT to the whole process group of `qkinspect sweep` on its local cluster, as a terminal sends it."""
    import os
    import signal
    import subprocess
    import sys

    out = tmp_path / "out"
    args = ["sweep", f"{medium_run}/checkpoint-*", "--out", str(out), "--metrics", "all", "--layer-form", "-f", "csv"]
    # The child must get SIGINT's default action, even when this test runs in a shell's background job (which
    # starts with SIGINT ignored, a disposition a child inherits).
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "qkinspect", *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, before)
    deadline = time.monotonic() + 240
    while not list(out.glob("results/*.json")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "Warning" not in err and err.strip().splitlines()[-1] == "error: interrupted"
    kept = {p: p.stat().st_mtime_ns for p in out.glob("results/*.json")}
    assert 1 <= len(kept) < 6 and not list(out.glob("results/.*"))
    r = cli(*args, "--scheduler", cluster.address)  # the same command, now on the cluster: the keys are the same
    assert r.exit_code == 0, r.stderr
    assert f"{6 - len(kept)} computed, {len(kept)} already in" in r.stderr
    assert {p: p.stat().st_mtime_ns for p in kept} == kept


def test_report_of_a_sweep(swept, cli, tmp_path):
    pypdf = pytest.importorskip("pypdf")
    out, _ = swept
    r = cli("report", out, "-o", tmp_path / "s.pdf")
    assert r.exit_code == 0, r.stderr
    assert r.stderr.strip() == f"note: wrote a 5-page sweep report to {tmp_path / 's.pdf'}"
    pages = pypdf.PdfReader(tmp_path / "s.pdf").pages
    cover = pages[0].extract_text()
    cover = " ".join(cover.split())
    assert "6, steps 500-3000 (read from their names)" in cover and "6 with results, 0 failed" in cover
    assert ("figures symmetry score (symmetry), effective rank (qk_effective_rank), Q/K subspace overlap "
            "(overlap_qk), directionality (directionality), against training step") in cover
    assert "training step" in pages[1].extract_text() and "symmetry" in pages[1].extract_text()
    assert "Thick lines: per layer" in " ".join(pages[1].extract_text().split())  # its caption
    r = cli("report", out, "--html", "-o", tmp_path / "s.html")
    assert r.exit_code == 0, r.stderr
    assert r.stderr.strip() == f"note: wrote an HTML sweep report to {tmp_path / 's.html'}"
    page = (tmp_path / "s.html").read_text()
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert "6 checkpoints, steps 500-3000; 6 with results, 0 failed" in page
    assert page.count("<svg") == 4 and page.count("<figure>") == 4  # the PDF's four figures, inline
    assert page.count("<tr><td>") == 6 and "<td>3000</td>" in page  # every checkpoint, with its step
