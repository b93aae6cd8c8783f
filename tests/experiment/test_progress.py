"""Every long phase of `experiment` tells a progress receiver its name and counts its own units (loading, baseline,
exact runs in unit × edit, the estimate's backward passes and its verification, each healing run's steps with its
training loss); the CLI's bar shows them on a terminal only, and never under --quiet."""

from __future__ import annotations

import random
import string
import sys

import pytest

from qkinspect.experiment.model.scoring import Text
from qkinspect.experiment.requests import HealOptions
from qkinspect.experiment.run import run_experiment
from qkinspect.progress import phase
from tests.experiment import tiny_models


def training_text():
    rnd = random.Random(0)
    return Text("random words", " ".join("".join(rnd.choices(string.ascii_lowercase, k=rnd.randint(2, 7)))
                                         for _ in range(1200)))


class Recorder:
    """A progress receiver that keeps every phase and every tick."""

    def __init__(self):
        self.phases: list[dict] = []

    def phase(self, name, total, unit):
        self.phases.append({"name": name, "total": total, "unit": unit, "ticks": []})

    def __call__(self, done, total, status=""):
        assert total == self.phases[-1]["total"]
        self.phases[-1]["ticks"].append((done, status))

    def names(self):
        return [p["name"] for p in self.phases]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return str(tiny_models.llama(tmp_path_factory.mktemp("progress") / "llama"))


def _counted_to_the_end(p: dict) -> None:
    """A countable phase ticks 1, 2, ... up to its total, in order."""
    assert [d for d, _ in p["ticks"]] == list(range(1, p["total"] + 1)), p


def test_exact_runs_are_counted_in_head_x_edit(llama):
    rec = Recorder()
    run_experiment(llama, "share_qk,rank:2", layers=[1], heads=[0, 1, 3], tokens=96, window=32, progress=rec)
    assert rec.names() == ["loading the model", "baseline", "exact runs"]
    load, base, runs = rec.phases
    assert load["total"] is None and load["ticks"] == []  # not countable: a bar with its elapsed time
    assert base["unit"] == "batches"
    _counted_to_the_end(base)
    assert (runs["total"], runs["unit"]) == (3 * 3, "head × edit")  # 3 heads x (share_qk, rank:2, ablate)
    _counted_to_the_end(runs)
    assert {s for _, s in runs["ticks"]} == {"share_qk", "rank:2", "ablate"}


def test_the_estimate_counts_its_backward_passes_and_its_verification(llama):
    rec = Recorder()
    run_experiment(llama, "share_qk", tokens=96, window=32, estimate=True, probes=3, verify=2, reference=False,
                   progress=rec)
    assert rec.names() == ["loading the model", "baseline", "estimate: gradients", "estimate: spot checks",
                           "verifying the estimate"]
    grads, spot, verify = rec.phases[2:]
    assert spot["unit"] == "exact runs on part of the text" and spot["total"] >= 1
    _counted_to_the_end(spot)
    assert grads["unit"] == "backward passes" and grads["total"] % (3 + 1) == 0  # per chunk: the loss + 3 probes
    _counted_to_the_end(grads)
    assert (verify["total"], verify["unit"]) == (2, "exact runs")
    _counted_to_the_end(verify)


def test_each_healing_run_counts_its_steps_with_the_training_loss(llama):
    rec = Recorder()
    run_experiment(llama, "share_qk", scope="layer", layers=[1], tokens=96, window=32, reference=False,
                   text=training_text(), heal=HealOptions(steps=3, lr=3e-2, batch_tokens=64), progress=rec)
    assert rec.names()[3:] == ["healing 1/2: control", "healing 2/2: share_qk-L1"]
    for p in rec.phases[3:]:
        assert (p["total"], p["unit"]) == (3, "steps")
        _counted_to_the_end(p)
        losses = [float(s.removeprefix("loss ")) for _, s in p["ticks"]]
        assert all(x > 0 for x in losses)


def test_a_plain_callable_gets_every_countable_phase(llama):
    calls = []
    run_experiment(llama, "share_qk", layers=[1], heads=[0], tokens=96, window=32, reference=False,
                   progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (1, 1)  # the one exact run, after the baseline's batches
    assert all(0 < d <= t for d, t in calls)


def test_phase_helper_without_a_receiver_or_a_count():
    phase(None, "x", 3)(1)  # nothing to tell: no error
    calls = []
    phase(lambda d, t: calls.append((d, t)), "loading")(0)  # uncountable: a plain callable hears nothing
    phase(lambda d, t: calls.append((d, t)), "runs", 2, "head × edit")(1, status="share_qk")
    assert calls == [(1, 2)]


# -- the CLI's bar ----------------------------------------------------------------------------------------------------

@pytest.fixture
def terminal(monkeypatch):
    from qkinspect.cli import output

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    monkeypatch.setitem(output.QUIET, "on", False)
    return output


def test_the_bar_shows_each_phase_in_its_unit(terminal):
    p = terminal.Progress("experiment", delay=0.0)
    try:
        p.phase("loading the model", None, "")
        task = p._bar.tasks[0]
        assert task.description == "loading the model" and task.total is None and task.fields["count"] == ""
        p.phase("exact runs", 27, "head × edit")
        p(4, 27, "share_qk")
        task = p._bar.tasks[0]
        assert (task.description, task.completed, task.total) == ("exact runs", 4, 27)
        assert task.fields["count"] == "4/27 head × edit" and task.fields["status"] == "share_qk"
        p.phase("healing 1/2: control", 10, "steps")
        task = p._bar.tasks[0]  # a new phase: nothing of the last one's count or status is left on the bar
        assert (task.fields["count"], task.fields["status"], task.completed) == ("0/10 steps", "", 0)
        p(3, 10, "loss 3.2100")
        task = p._bar.tasks[0]
        assert task.fields["count"] == "3/10 steps" and task.fields["status"] == "loss 3.2100"
        assert [ph[0] for ph in p.phases] == ["loading the model", "exact runs", "healing 1/2: control"]
    finally:
        p.close()
    assert p._bar is None


def test_an_uncountable_phase_shows_after_the_delay(terminal):
    import time

    p = terminal.Progress("experiment", delay=0.2)
    try:
        p.phase("loading the model", None, "")
        deadline = time.monotonic() + 10
        while p._bar is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert p._bar is not None and p._bar.tasks[0].description == "loading the model"
    finally:
        p.close()


def test_quiet_and_pipes_show_no_bar(terminal, monkeypatch):
    monkeypatch.setitem(terminal.QUIET, "on", True)
    p = terminal.Progress("experiment", delay=0.0)
    p.phase("loading the model", None, "")
    p(0, None)
    assert p._bar is None and p._timer is None
    p.close()
    monkeypatch.setitem(terminal.QUIET, "on", False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    q = terminal.Progress("experiment", delay=0.0)
    q.phase("baseline", 3, "batches")
    assert q._bar is None
    q.close()


def test_quiet_is_a_root_option():
    from typer.testing import CliRunner

    from qkinspect.cli import output
    from qkinspect.cli.app import app

    try:
        r = CliRunner().invoke(app, ["--quiet", "info", "--help"])
        assert r.exit_code == 0 and output.QUIET["on"]
    finally:
        output.QUIET["on"] = False
