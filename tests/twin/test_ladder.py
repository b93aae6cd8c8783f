"""The ladder (qkinspect.twin.ladder): bad shapes and budgets refused in one line before anything is trained, the
steps set from tokens per parameter, one folder of twin folders read back with per-shape records and fits, and one
shape that is today's twin folder exactly."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

import qkinspect
from qkinspect.cli.app import app
from qkinspect.twin.ladder import Rung, budget, count_non_embedding, read_ladder, resolve
from qkinspect.twin.request import Shape
from qkinspect.twin.saved import read_twin
from tests.one_line import one_error_line

SMALL = dict(context=8, batch=2, eval_windows=4, workers=0, seeds=2)
CLI_SMALL = ["--context", "8", "--batch", "2", "--eval-windows", "4", "--workers", "0", "--seeds", "2"]


def twin(*args):
    return CliRunner().invoke(app, ["twin", *map(str, args)])


@pytest.mark.parametrize("args, says", [
    (["--shapes", "2x64,big"], ["--shapes", "'big'", "layers x d_model"]),
    (["--shapes", "2x"], ["--shapes"]),
    (["--shapes", "0x64"], ["--shapes"]),
    (["--shapes", ","], ["--shapes", "at least one"]),
    (["--shapes", "1x16,1x24", "--head-size", "16"], ["--head-size 16", "does not divide", "24"]),
    (["--shapes", "1x16,1x48"], ["head size 32", "--head-size", "16"]),
    (["--shapes", "1x16,1x32", "--head-size", "8", "--heads", "2"], ["--head-size", "--heads"]),
    (["--shapes", "1x16,1x32", "--head-size", "0"], ["--head-size 0"]),
    (["--shapes", "1x16,1x32", "--head-size", "8", "--tokens-per-param", "0"], ["--tokens-per-param 0"]),
    (["--shapes", "1x16,1x32", "--head-size", "8", "--tokens-per-param", "-2"], ["--tokens-per-param"]),
    (["--shapes", "1x16,1x32", "--head-size", "8", "--tokens-per-param", "nan"], ["--tokens-per-param"]),
    (["--shapes", "1x16,1x32", "--head-size", "8", "--tokens-per-param", "2", "--steps", "5"],
     ["--tokens-per-param", "--steps"]),
    (["--tokens-per-param", "2", "--steps", "5"], ["--tokens-per-param", "--steps"]),
    (["--shapes", "1x16,1x32", "--heads", "3"], ["--d-model", "--heads"]),
    (["--shapes", "1x16,1x32", "--head-size", "8", "--warmup", "50", "--steps", "10"], ["--warmup"]),
    (["--shapes", "1x16,1x32", "--head-size", "8", "--variants", "nope"], ["--variants"]),
    (["--shapes", "1x16,1x32", "--config", "c.json"], ["--shapes", "--config"]),
    (["--shapes", "1x16", "--rows", "scaling"], ["--rows scaling", "ladder"]),
])
def test_bad_ladder_input_is_one_line_and_nothing_is_written(tmp_path, args, says):
    one_error_line(twin("--out", tmp_path / "out", *CLI_SMALL, *args), *says)
    assert not (tmp_path / "out").exists()


def test_non_embedding_parameters_by_hand():
    # llama: per layer 4 d² (q, k, v, o) + 3 d·mlp (SwiGLU) + 2 d (norms), then the final norm
    for layers, d in ((1, 32), (2, 48), (3, 64)):
        mlp = 16 * math.ceil(8 * d / 3 / 16)
        (rung,) = budget([Rung(layers, d, d // 16, 1)], 1.0, arch="llama", context=8, batch=1, config=None)
        assert rung.non_embedding_params == layers * (4 * d * d + 3 * d * mlp + 2 * d) + d
    # gpt2 (biases, learned positions left out with the tied embeddings): 12 d² + 13 d per layer, + 2 d
    (rung,) = budget([Rung(2, 32, 2, 1)], 1.0, arch="gpt2", context=8, batch=1, config=None)
    assert rung.non_embedding_params == 2 * (12 * 32 * 32 + 13 * 32) + 2 * 32


def test_counted_on_a_built_model_as_on_meta():
    from qkinspect.twin.model import config_for, standard_model

    model = standard_model(config_for(Shape("llama", 2, 32, 2, 8), 50), 0)
    (rung,) = budget([Rung(2, 32, 2, 1)], 1.0, arch="llama", context=8, batch=1, config=None)
    everything = sum(p.numel() for p in model.parameters())
    assert count_non_embedding(model) == rung.non_embedding_params == everything - 2 * 50 * 32


def test_tokens_per_param_sets_each_shapes_steps():
    rungs = budget(resolve(shapes="1x16,2x32", layers=4, d_model=128, heads=None, head_size=8, steps=None,
                           tokens_per_param=3.0, config=None), 3.0, arch="llama", context=8, batch=2, config=None)
    assert [(r.layers, r.d_model, r.heads) for r in rungs] == [(1, 16, 2), (2, 32, 4)]
    for r in rungs:
        assert r.steps == round(3.0 * r.non_embedding_params / 16)
    fixed = resolve(shapes="1x16,2x32", layers=4, d_model=128, heads=3, head_size=None, steps=7,
                    tokens_per_param=None, config=None)
    assert [(r.heads, r.steps) for r in fixed] == [(3, 7), (3, 7)]  # --heads applies to every shape
    assert [(r.heads, r.steps) for r in resolve(shapes=None, layers=4, d_model=128, heads=None, head_size=None,
                                                steps=None, tokens_per_param=None, config=None)] == [(4, 2000)]


def test_one_shape_is_todays_twin_folder(tmp_path, small_text):
    a = qkinspect.twin(tmp_path / "a", text=small_text, variants="share_qk", layers=1, d_model=16, heads=2, steps=3,
                       **SMALL)
    b = qkinspect.twin(tmp_path / "b", text=small_text, variants="share_qk", shapes="1x16", head_size=8, steps=3,
                       **SMALL)
    assert type(a) is type(b) and not (tmp_path / "b" / "ladder.json").exists()
    key = lambda p: json.loads((p / "twin.json").read_text())["key"]  # noqa: E731
    assert key(tmp_path / "a") == key(tmp_path / "b")
    assert sorted(p.name for p in (tmp_path / "a" / "runs").iterdir()) == \
        sorted(p.name for p in (tmp_path / "b" / "runs").iterdir())
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(a.rows("runs")) == strip(b.rows("runs"))


def test_a_ladder_folder_holds_every_shape_and_reads_back(tmp_path, small_text):
    lad = qkinspect.twin(tmp_path / "lad", text=small_text, variants="share_qk,symmetric", shapes="1x16,2x16",
                         head_size=8, tokens_per_param=1.0, **SMALL)
    assert sorted(p.name for p in (tmp_path / "lad").iterdir()) == ["1x16", "2x16", "ladder.json"]
    for rung in lad.rungs:
        sub = read_twin(tmp_path / "lad" / rung.name)  # each shape is a twin folder of its own
        assert sub.setup["training"]["steps"] == rung.steps
        assert {(r.variant, r.seed) for r in sub.runs} == {(v, s) for v in ("standard", "share_qk", "symmetric")
                                                           for s in (0, 1)}
    rows = lad.rows("summary")
    assert [(r["shape"], r["variant"]) for r in rows] == [(s, v) for s in ("1x16", "2x16")
                                                         for v in ("standard", "share_qk", "symmetric")]
    for r, rung in zip(rows, [lad.rungs[0]] * 3 + [lad.rungs[1]] * 3, strict=True):
        assert r["tokens"] == rung.steps * 2 * 8 and r["non_embedding_params"] == rung.non_embedding_params
        for k in ("params", "diff", "ci_low", "ci_high", "verdict"):
            assert k in r
    twin_1 = read_twin(tmp_path / "lad" / "1x16")
    assert [r for r in rows if r["shape"] == "1x16"] == [
        {**r, "shape": "1x16", "layers": 1, "d_model": 16, "heads": 2, "standard_params": twin_1.runs[0].params,
         "non_embedding_params": lad.rungs[0].non_embedding_params, "steps": lad.rungs[0].steps,
         "tokens": lad.rungs[0].steps * 16} for r in twin_1.rows("summary")]
    assert [f.variant for f in lad.fits] == ["share_qk", "symmetric"]
    again = read_ladder(tmp_path / "lad")
    assert again.rows("summary") == rows and again.rows("scaling") == lad.rows("scaling")
    assert {r["shape"] for r in lad.rows("runs")} == {"1x16", "2x16"}
    assert lad.document()["kind"] == "twin-ladder"


@pytest.fixture(scope="module")
def cli_ladder(tmp_path_factory, small_text):
    out = tmp_path_factory.mktemp("ladder") / "lad"
    r = twin("--out", out, "--text", small_text, *CLI_SMALL, "--shapes", "1x16,2x16", "--head-size", "8",
             "--steps", "3", "--variants", "share_qk,symmetric", "-f", "table")
    assert r.exit_code == 0, r.stderr
    return out


def test_the_ladder_table_fits_80_columns(cli_ladder, small_text):
    from rich.console import Console

    console = Console(width=80, record=True, force_terminal=False)
    read_ladder(cli_ladder).render_table(console)
    text = console.export_text()
    table = [line for line in text.splitlines() if line.startswith(("shape", "1x16", "2x16", "━"))]
    assert table and all(len(line) <= 80 for line in table)
    assert "share_qk" in text and ("no power law" in text or "α =" in text)
    rows = twin("--out", cli_ladder, "--text", small_text, *CLI_SMALL, "--shapes", "1x16,2x16", "--head-size", "8",
                "--steps", "3", "--variants", "share_qk,symmetric", "-f", "csv", "--rows", "scaling")
    assert rows.exit_code == 0 and rows.stdout.splitlines()[0].startswith("variant,rungs,alpha")
    assert "already in" in rows.stderr  # the same command resumes: nothing trained again


def test_plot_and_report_draw_a_ladder_folder(cli_ladder, tmp_path):
    r = CliRunner().invoke(app, ["plot", str(cli_ladder), "--kind", "scaling", "-o", str(tmp_path / "s.png")])
    assert r.exit_code == 0, r.stderr
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    r = CliRunner().invoke(app, ["report", str(cli_ladder), "-o", str(tmp_path / "l.pdf")])
    assert r.exit_code == 0 and "twin ladder report" in r.stderr, r.stderr
    assert (tmp_path / "l.pdf").read_bytes()[:4] == b"%PDF"
    r = CliRunner().invoke(app, ["report", str(cli_ladder), "--html", "-o", str(tmp_path / "l.html")])
    page = (tmp_path / "l.html").read_text()
    assert r.exit_code == 0 and "Scaling" in page and "1x16" in page and "<svg" in page
    # each shape is a twin folder its own figures draw; the ladder draws the scaling figure only
    r = CliRunner().invoke(app, ["plot", str(cli_ladder / "2x16"), "--kind", "gap", "-o", str(tmp_path / "g.png")])
    assert r.exit_code == 0, r.stderr
    one_error_line(CliRunner().invoke(app, ["plot", str(cli_ladder), "--kind", "gap", "-o", str(tmp_path / "x.png")]),
                   "--kind gap", "scaling")
    one_error_line(CliRunner().invoke(app, ["plot", str(tmp_path), "--kind", "scaling", "-o",
                                            str(tmp_path / "x.png")]), "--kind scaling", "ladder.json")
    assert not (tmp_path / "x.png").exists()


def test_save_writes_what_the_extension_names(cli_ladder, tmp_path):
    lad = read_ladder(cli_ladder)
    assert lad.save(tmp_path / "s.csv").read_text().splitlines()[0].startswith("shape,layers,d_model,heads")
    assert lad.save(tmp_path / "f.csv", rows="scaling").read_text().startswith("variant,rungs,alpha")
    from tests.cli.schema import validate

    doc = json.loads(lad.save(tmp_path / "l.json").read_text())
    assert doc["kind"] == "twin-ladder" and validate(doc)


@pytest.mark.parametrize("damage, says", [
    ("not json", ["ladder.json", "JSON"]),
    ({"kind": "twin-ladder", "shapes": "1x16"}, ["ladder.json", "shapes"]),
    ({"kind": "twin-ladder", "shapes": [{"name": "1x16", "layers": "x", "d_model": 16, "heads": 2, "steps": 3,
                                         "non_embedding_params": 10}]}, ["ladder.json", "shapes.layers"]),
    ({"kind": "twin-ladder", "shapes": [{"name": "9x16", "layers": 1, "d_model": 16, "heads": 2, "steps": 3,
                                         "non_embedding_params": 10}]}, ["ladder.json", "shapes.name", "1x16"]),
    ({"kind": "sweep", "shapes": []}, ["ladder.json", "kind"]),
])
def test_a_damaged_ladder_is_one_line_and_no_figure(cli_ladder, tmp_path, damage, says):
    import shutil

    folder = tmp_path / "lad"
    shutil.copytree(cli_ladder, folder)
    (folder / "ladder.json").write_text(damage if isinstance(damage, str) else json.dumps(damage))
    for args in (["plot", str(folder), "--kind", "scaling", "-o", str(tmp_path / "x.png")],
                 ["report", str(folder), "-o", str(tmp_path / "x.pdf")]):
        one_error_line(CliRunner().invoke(app, args), *says)
    assert not (tmp_path / "x.png").exists() and not (tmp_path / "x.pdf").exists()


def test_a_rejected_power_law_is_said_in_the_terminal_and_the_report(cli_ladder):
    """A fit the lack-of-fit test rejects keeps its numbers in the records but is called no power law where a reader
    meets it (the terminal line, the report's words); one it does not reject says its p."""
    import dataclasses

    from rich.console import Console

    from qkinspect.report.twin.ladder import fit_words
    from qkinspect.twin.scaling import ScalingFit

    lad = read_ladder(cli_ladder)
    fit = ScalingFit("share_qk", 4, -0.4, -0.46, -0.35, 0.0011, 11.3, 0.9, 2000, 0, None, 0.001)
    kept = dataclasses.replace(fit, residual=0.9, p_fit=0.6)
    assert fit.describes is False and kept.describes is True and fit.row()["p_fit"] == 0.001
    lad = dataclasses.replace(lad, fits=(fit, dataclasses.replace(kept, variant="symmetric")))
    console = Console(width=200, record=True, force_terminal=False)
    lad.render_table(console)
    text = console.export_text()
    assert "share_qk: no power law: it does not describe the shapes" in text and "p = 0.001" in text
    assert "symmetric: gap ≈" in text and "lack of fit p = 0.600" in text
    words = fit_words(lad)
    assert "does not describe these shapes" in words[0] and "read the shapes' gaps, not α" in words[0]
    assert "the law is not rejected" in words[1]
