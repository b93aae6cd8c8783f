"""A twin folder's figures and report: the data each figure draws equals what numpy and scipy make of the folder's
records, the report's text holds the setup and the summary, and bad folders or options are one error line."""

from __future__ import annotations

import json
import shutil
from collections import defaultdict

import numpy as np
import pytest
from scipy import stats

import qkinspect
from qkinspect.report.style import fmt
from qkinspect.twin.saved import read_twin
from tests.one_line import one_error_line
from tests.twin.conftest import TINY, text_file

VARIANTS = ("standard", "share_qk", "symmetric")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Three seeds of standard, share_qk and symmetric, two learning rates, evaluated and tracked on the way."""
    root = tmp_path_factory.mktemp("twinfig")
    text = text_file(root / "t.txt")
    qkinspect.twin(root / "twin", text=text, variants="share_qk,symmetric", seeds=3, steps=6, eval_every=2,
                   track_every=3, lr="1e-3,3e-3", **TINY)
    return root / "twin"


@pytest.fixture(scope="module")
def twin(folder):
    return read_twin(folder)


def chosen(twin) -> dict[str, float]:
    return {s.variant: s.lr for s in twin.summaries}


def losses(twin) -> dict[str, dict[int, dict[int, float]]]:
    """variant -> step -> seed -> held-out loss at the chosen rate, straight from the records."""
    out: dict = defaultdict(lambda: defaultdict(dict))
    for p in twin.points:
        if p.lr == chosen(twin)[p.variant]:
            out[p.variant][p.step][p.seed] = p.val_loss
    return out


def band(collection) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of a fill_between polygon's vertices."""
    v = np.concatenate([p.vertices for p in collection.get_paths()])
    return v[:, 0], v[:, 1]


def edges_at(collection, x: float) -> tuple[float, float]:
    xs, ys = band(collection)
    at = ys[np.isclose(xs, x)]
    return float(at.min()), float(at.max())


def test_the_learning_figure_draws_the_mean_and_one_sd_over_seeds(twin):
    from qkinspect.report.twin.figures import learning_figure

    fig = learning_figure(twin)
    ax = fig.axes[0]
    lines = {line.get_label().split(" ")[0]: line for line in ax.get_lines()}
    assert set(lines) == set(VARIANTS)
    assert "±1 s.d." in fig.legends[0].get_title().get_text()
    bands = dict(zip([v for v in lines], ax.collections, strict=True))  # drawn in the same order
    for variant, steps in losses(twin).items():
        order = sorted(steps)
        values = np.array([[steps[s][seed] for seed in range(3)] for s in order])
        mean, sd = values.mean(axis=1), values.std(axis=1, ddof=1)
        np.testing.assert_allclose(lines[variant].get_xdata(), order)
        np.testing.assert_allclose(lines[variant].get_ydata(), mean, rtol=1e-12)
        for k, step in enumerate(order):
            np.testing.assert_allclose(edges_at(bands[variant], step), (mean[k] - sd[k], mean[k] + sd[k]),
                                       rtol=1e-12)


def test_the_gap_figure_draws_the_paired_t_interval_and_the_margin(twin):
    from qkinspect.report.twin.figures import gap_figure

    axes = [ax for ax in gap_figure(twin).axes if ax.get_visible()]
    by = losses(twin)
    assert [ax.get_title(loc="left").splitlines()[0] for ax in axes] == ["share_qk (3 paired seeds)",
                                                                        "symmetric (3 paired seeds)"]
    for ax in axes:
        variant = ax.get_title(loc="left").split(" ")[0]
        flat = sorted({round(float(line.get_ydata()[0]), 12) for line in ax.get_lines()
                       if len(set(line.get_ydata())) == 1 and len(line.get_ydata()) == 2})
        assert flat == [-0.02, 0.0, 0.02]  # zero and ± the margin (axhline)
        drawn = next(line for line in ax.get_lines() if len(line.get_xdata()) > 2)
        order = sorted(by[variant])
        for k, step in enumerate(order):
            d = np.array([by[variant][step][s] - by["standard"][step][s] for s in range(3)])
            low, high = stats.t.interval(0.90, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
            assert drawn.get_ydata()[k] == pytest.approx(d.mean(), abs=1e-12)
            np.testing.assert_allclose(edges_at(ax.collections[0], step), (low, high), rtol=1e-9, atol=1e-12)
        final = next(s for s in twin.summaries if s.variant == variant)
        assert f"[{fmt(final.ci_low)}, {fmt(final.ci_high)}]: {final.verdict}" in ax.get_title(loc="left")


def test_the_trajectory_figure_draws_each_layers_median_over_heads_then_seeds(twin):
    from qkinspect.report.twin.figures import trajectory_figure

    fig = trajectory_figure(twin, "symmetry")
    axes = [ax for ax in fig.axes if ax.get_visible() and ax.get_title(loc="left")]
    assert [ax.get_title(loc="left").split(" ")[0] for ax in axes] == list(VARIANTS)
    heads: dict = defaultdict(list)
    for t in twin.trajectories:
        if t.metric == "symmetry" and t.lr == chosen(twin)[t.variant]:
            heads[t.variant, t.layer, t.step, t.seed].append(t.value)
    for ax in axes:
        variant = ax.get_title(loc="left").split(" ")[0]
        lines = ax.get_lines()
        assert len(lines) == TINY["layers"]
        for layer, line in enumerate(lines):
            steps = sorted({k[2] for k in heads if k[:2] == (variant, layer)})
            medians = np.array([[np.median(heads[variant, layer, s, seed]) for seed in range(3)] for s in steps])
            np.testing.assert_allclose(line.get_xdata(), steps)
            np.testing.assert_allclose(line.get_ydata(), medians.mean(axis=1), rtol=1e-12, atol=1e-12)
    constrained = [ax for ax in axes if not ax.get_title(loc="left").startswith("standard")]
    for ax in constrained:  # one matrix for queries and keys: symmetry 1 at every step
        assert all(np.allclose(line.get_ydata(), 1.0, atol=1e-4) for line in ax.get_lines())


def test_a_metric_the_runs_did_not_track_is_refused(twin):
    from qkinspect.errors import InputError
    from qkinspect.report.twin.figures import trajectory_figure

    with pytest.raises(InputError, match="has no trajectory of it"):
        trajectory_figure(twin, "qk_stable_rank")


def test_the_report_holds_the_setup_the_summary_and_every_figure(cli, folder, twin, tmp_path):
    from pypdf import PdfReader

    out = tmp_path / "twin.pdf"
    r = cli("report", folder, "-o", out)
    assert r.exit_code == 0, r.stderr
    reader = PdfReader(out)
    assert f"wrote a {len(reader.pages)}-page twin report" in r.stderr
    first = reader.pages[0].extract_text()
    text = " ".join(p.extract_text() for p in reader.pages)
    setup = twin.setup
    for words in ("qkinspect twin report", "2 layers × width 32, 4 heads", "context 16", setup["text"]["sha256"],
                  "held out", "the last 10 %", "tokenizer", "char, vocabulary", "The answer holds at this scale",
                  "seeds", "0.02 nats", "Learning-rate sweep", "12 finished, 0 failed, of 12 planned"):
        assert words in first.replace("\n", " ") or words in text, words
    assert f"{_standard(twin).params:,} parameters" in first
    for s in twin.summaries:
        assert s.variant in first and fmt(s.val_loss) in first and s.verdict in first
        if s.variant != "standard":
            assert all(fmt(x) in first for x in (s.diff, s.ci_low, s.ci_high))
    for caption in ("Held-out loss (mean cross-entropy", "90 % t-interval, mean ± t(0.95",
                    "Symmetry score measured from the weights", "Q/K subspace overlap measured"):
        assert caption in text.replace("\n", " "), caption
    assert len(reader.pages) == 2 + 2 + 2  # setup and tables (two pages), learning, gap, two trajectories


def _standard(twin):
    return next(s for s in twin.summaries if s.variant == "standard")


def test_the_html_report_stands_alone(cli, folder, twin, tmp_path):
    out = tmp_path / "twin.html"
    r = cli("report", folder, "--html", "-o", out)
    assert r.exit_code == 0, r.stderr
    page = out.read_text()
    assert page.count("<svg") == 4 and "The answer holds at this scale" in page
    assert all(fmt(s.val_loss) in page for s in twin.summaries)


@pytest.mark.parametrize("kind,extra", [("learning", ()), ("gap", ()), ("trajectory", ("--metric", "overlap_qk")),
                                        (None, ())])
def test_plot_draws_a_twin_folders_figures(cli, folder, tmp_path, kind, extra):
    out = tmp_path / f"{kind}.png"
    r = cli("plot", folder, *(("--kind", kind) if kind else ()), *extra, "-o", out)
    assert r.exit_code == 0, r.stderr
    drawn = {None: "learning", "trajectory": "overlap_qk trajectory"}.get(kind, kind)  # learning: the default
    assert out.stat().st_size > 10_000 and f"wrote the {drawn} figure" in r.stderr


@pytest.mark.parametrize("args,says", [
    (("--kind", "learning", "--layers", "0"), "--layers: not for a twin folder"),
    (("--kind", "gap", "--compare", "x"), "--compare: not for a twin folder"),
    (("--kind", "learning", "--fold-ln"), "--fold-ln: not for a twin folder"),
    (("--kind", "learning", "--metric", "symmetry"), "--metric applies to --kind trajectory only"),
    (("--kind", "spectra",), "a twin folder draws --kind learning, gap or trajectory"),
    (("--kind", "symmetry",), "a twin folder draws --kind learning, gap or trajectory"),  # once drew learning
    (("--kind", "trajectory", "--metric", "qk_k90"), "qk_k90"),
])
def test_options_a_twin_folder_cannot_take_are_refused(cli, folder, tmp_path, args, says):
    out = tmp_path / "f.png"
    one_error_line(cli("plot", folder, *args, "-o", out), says)
    assert not out.exists()


def test_report_options_a_twin_folder_cannot_take_are_refused(cli, folder, tmp_path):
    out = tmp_path / "r.pdf"
    one_error_line(cli("report", folder, "--layer-form", "-o", out), "--layer-form: not for a twin folder")
    one_error_line(cli("report", folder, "--experiment", tmp_path / "runs.json", "-o", out), "--experiment")
    assert not out.exists()


def test_learning_and_gap_need_a_twin_folder(cli, tmp_path):
    one_error_line(cli("plot", tmp_path, "--kind", "gap", "-o", tmp_path / "g.png"), "--kind gap",
                   "not one (it has no twin.json)")


@pytest.mark.parametrize("damage", ["not json", "margin", "points"])
def test_a_damaged_twin_folder_is_one_line_naming_the_file(cli, folder, tmp_path, damage):
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    manifest = bad / "twin.json"
    if damage == "not json":
        manifest.write_text("{", encoding="utf-8")
        says = ("twin.json", "not readable as JSON")
    elif damage == "margin":
        doc = json.loads(manifest.read_text())
        doc["plan"]["margin"] = "wide"
        manifest.write_text(json.dumps(doc))
        says = ("twin.json", "plan.margin")
    else:
        run = sorted((bad / "runs").glob("*.json"))[0]
        doc = json.loads(run.read_text())
        doc["run"]["points"] = []
        run.write_text(json.dumps(doc))
        says = (run.name, "points")
    for args in (("plot", bad, "--kind", "learning", "-o", tmp_path / "l.png"),
                 ("report", bad, "-o", tmp_path / "r.pdf")):
        one_error_line(cli(*args), *says)
    assert not (tmp_path / "l.png").exists() and not (tmp_path / "r.pdf").exists()


def test_the_report_lists_failed_runs(cli, folder, tmp_path):
    from pypdf import PdfReader

    failed = tmp_path / "failed"
    shutil.copytree(folder, failed)
    doc = json.loads((failed / "twin.json").read_text())
    doc["failures"] = [{"variant": "symmetric", "seed": 2, "lr": 0.003, "error": "RuntimeError: out of memory"}]
    (failed / "twin.json").write_text(json.dumps(doc))
    next((failed / "runs").glob("symmetric-s2-*.json")).unlink()
    out = tmp_path / "r.pdf"
    assert cli("report", failed, "-o", out).exit_code == 0
    text = " ".join(p.extract_text() for p in PdfReader(out).pages)
    assert "11 finished, 1 failed, of 12 planned" in text.replace("\n", " ")
    assert "Failed runs" in text and "symmetric seed 2 lr 0.003: RuntimeError: out of memory" in text
    html = tmp_path / "r.html"
    assert cli("report", failed, "--html", "-o", html).exit_code == 0
    assert "RuntimeError: out of memory" in html.read_text()


def test_the_gap_at_the_last_step_is_the_summarys_difference_and_interval(twin):
    from qkinspect.twin.curves import gap_curves

    last = {}
    for p in gap_curves(twin):
        last[p.variant] = p  # in step order
    for s in twin.summaries[1:]:
        p = last[s.variant]
        assert (p.seeds, p.diff, p.ci_low, p.ci_high) == pytest.approx((s.seeds, s.diff, s.ci_low, s.ci_high))


def test_a_folder_with_no_finished_run_is_one_line(cli, folder, tmp_path):
    empty = tmp_path / "empty"
    shutil.copytree(folder, empty)
    for run in (empty / "runs").glob("*.json"):
        run.unlink()
    one_error_line(cli("plot", empty, "-o", tmp_path / "l.png"), "no finished runs")
    one_error_line(cli("report", empty, "-o", tmp_path / "r.pdf"), "no finished runs")
    assert not list(tmp_path.glob("*.p*"))


def test_a_title_of_your_own(cli, folder, tmp_path):
    out = tmp_path / "gap.svg"
    assert cli("plot", folder, "--kind", "gap", "--title", "tiny twins: the gap", "-o", out).exit_code == 0
    assert "tiny twins: the gap" in out.read_text()
