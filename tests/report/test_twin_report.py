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
from qkinspect.numbers import plain, signed_alike
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
        diff, low, high = signed_alike(final.diff, final.ci_low, final.ci_high)
        assert f"final {diff} [{low}, {high}]: {final.verdict}" in ax.get_title(loc="left")
        assert diff.startswith(("+", "-")) or diff == "0.0000"  # signed, as the CLI prints it


def test_the_gap_titles_print_the_numbers_as_the_cli_does(twin):
    """Signed, 4 decimals or two significant digits, never a negative zero: a small effect read
    `-0.000 [-0.000, -0.000]` with 3 decimals (issue 44)."""
    from dataclasses import replace

    from qkinspect.report.twin.figures import gap_figure

    small = {"share_qk": (-3.1e-05, -5.2e-05, -1.04e-05), "symmetric": (-0.0, -0.0012, 0.0012)}
    summaries = tuple(replace(s, diff=small[s.variant][0], ci_low=small[s.variant][1], ci_high=small[s.variant][2])
                      if s.variant in small else s for s in twin.summaries)
    titles = [ax.get_title(loc="left") for ax in gap_figure(replace(twin, summaries=summaries)).axes
              if ax.get_visible()]
    assert "final -0.000031 [-0.000052, -0.000010]:" in titles[0]
    assert "final 0.0000 [-0.0012, +0.0012]:" in titles[1]
    assert not any("-0.000 " in t or "-0.0000 " in t or "-0.000]" in t for t in titles)


def test_the_trajectory_figure_draws_each_layers_median_over_heads_then_seeds(twin):
    from qkinspect.report.twin.figures import trajectory_figure

    fig = trajectory_figure(twin, "symmetry", every_panel=True)
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


def test_panels_constant_by_construction_are_left_out_and_the_caption_says_so(twin):
    """share_qk and symmetric read symmetry and Q/K overlap 1 at every step: their panels took two thirds of the
    figure; the standard twin's is left, and the caption names what is not drawn (issue 44)."""
    from qkinspect.report.twin.figures import trajectory_caption, trajectory_figure

    for metric in ("symmetry", "overlap_qk"):
        axes = [ax for ax in trajectory_figure(twin, metric).axes if ax.get_visible() and ax.get_title(loc="left")]
        assert [ax.get_title(loc="left").split(" ")[0] for ax in axes] == ["standard"]
        assert "Not drawn: share_qk and symmetric, whose" in trajectory_caption(twin, metric)
        assert "1 at every step by construction" in trajectory_caption(twin, metric)


def test_the_overlap_trajectory_has_its_chance_line_and_the_layer_colours_stay_dark(twin):
    """The docs read the Q/K overlap against chance, d_head / d_model (8 / 32 here); the layer palette stops
    before viridis' yellow, which vanished on white (issue 44)."""
    from matplotlib.colors import to_rgb

    from qkinspect.report.twin.figures import trajectory_caption, trajectory_figure

    fig = trajectory_figure(twin, "overlap_qk")
    (ax,) = [ax for ax in fig.axes if ax.get_visible() and ax.get_title(loc="left")]
    flat = [line for line in ax.get_lines() if len(set(line.get_ydata())) == 1 and len(line.get_ydata()) == 2]
    assert [float(line.get_ydata()[0]) for line in flat] == [pytest.approx(8 / 32)]
    assert any("chance: d_head / d_model = 0.25" in t.get_text() for t in fig.legends[0].texts)
    assert "Dotted line: chance, d_head / d_model = 0.25" in trajectory_caption(twin, "overlap_qk")
    for line in ax.get_lines():
        r, g, b = to_rgb(line.get_color())
        assert 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.75  # no near-white line (viridis' end: 0.87)
    axes = [a for a in trajectory_figure(twin, "symmetry").axes if a.get_visible() and a.get_title(loc="left")]
    assert not any(len(set(line.get_ydata())) == 1 and len(line.get_ydata()) == 2 for line in axes[0].get_lines())


def test_the_learning_figure_keeps_every_variant_visible_and_its_legend_reads_by_row(twin):
    """Lines above every band, each variant with its own dash pattern and marker over standard's wider solid line;
    bands outlined, not merged fills; the zoomed panel has its y label; the legend fills row by row (issue 44)."""
    from qkinspect.report.twin.figures import learning_figure

    fig = learning_figure(twin)
    fig.canvas.draw()
    for ax in fig.axes:
        assert ax.get_ylabel() == "held-out loss (nats per token)"
        lines = {line.get_label().split(" ")[0]: line for line in ax.get_lines()}
        assert min(line.get_zorder() for line in lines.values()) > max(c.get_zorder() for c in ax.collections)
        assert all(lines[v].get_zorder() > lines["standard"].get_zorder() for v in VARIANTS[1:])
        assert lines["standard"].get_linestyle() == "-" and lines["standard"].get_linewidth() > max(
            lines[v].get_linewidth() for v in VARIANTS[1:])
        assert len({(str(line.get_linestyle()), str(line.get_dashes() if hasattr(line, "get_dashes") else ""),
                     line.get_marker()) for line in lines.values()}) == len(VARIANTS)
        assert len({line.get_marker() for line in lines.values()}) == len(VARIANTS)
        for band in ax.collections:
            assert band.get_facecolor()[0][3] < 0.1 and band.get_edgecolor()[0][3] > 0.3
    legend = fig.legends[0]
    tops = [round(t.get_window_extent().y0) for t in legend.texts]
    assert tops.count(max(tops)) == 3  # three columns: the top row holds three entries
    texts = sorted(legend.texts, key=lambda t: (-round(t.get_window_extent().y0), t.get_window_extent().x0))
    assert [t.get_text().split(" ")[0] for t in texts] == list(VARIANTS)  # row 1 left to right: the summary's order


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
    for s in twin.summaries:  # 4 decimals and signed differences, as `qkinspect twin` prints them
        assert s.variant in first and plain(s.val_loss) in first and s.verdict in first
        if s.variant != "standard":
            assert all(x in first for x in signed_alike(s.diff, s.ci_low, s.ci_high))
    assert "rounded to 4 decimals and differences signed, as qkinspect twin prints them" in " ".join(text.split())
    runs_page = next(p.extract_text() for p in reader.pages if "violation: the largest departure" in p.extract_text())
    assert all(plain(r.train_loss) in runs_page for r in twin.runs)  # the Runs table is kept on one page
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
    assert all(plain(s.val_loss) in page for s in twin.summaries)
    assert "rounded to 4 decimals and differences signed, as qkinspect twin prints them" in page


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
        says = ("twin.json", "not valid JSON")
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
