"""`plot` and `report` from a saved analysis (`qkinspect analyze -o run.json`): the records read back equal the live
analysis', every figure is drawn from the same data, and a bad or tampered file is one line (exit 2) naming it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from qkinspect.analysis.saved import read_saved
from qkinspect.report.analysis import figures

METRICS = "default,shared_qk_distance,head_overlap"  # what the report measures


@pytest.fixture(scope="module")
def saved(llama_path, tmp_path_factory):
    """(live result, path of its saved JSON written by the CLI, the result read back)."""
    from typer.testing import CliRunner

    import qkinspect
    from qkinspect.cli.app import app

    path = tmp_path_factory.mktemp("saved") / "run.json"
    r = CliRunner().invoke(app, ["analyze", str(llama_path), "--metrics", METRICS, "-o", str(path)])
    assert r.exit_code == 0, r.stderr
    live = qkinspect.analyze(str(llama_path), metrics=METRICS.split(","))
    return live, path, read_saved(path)


def _same_values(a, b) -> bool:
    return a.keys() == b.keys() and all((math.isnan(a[k]) and math.isnan(b[k])) or a[k] == b[k] for k in a)


def test_the_records_read_back_equal_the_live_analysis(saved):
    live, _, back = saved
    assert back.model == live.model and back.processing == live.processing
    assert back.metric_names == live.metric_names and back.baselines == live.baselines
    assert [(h.block, h.layer, h.head, h.kv_head, h.rank_q, h.rank_k, h.rank_v) for h in back.heads] == \
        [(h.block, h.layer, h.head, h.kv_head, h.rank_q, h.rank_k, h.rank_v) for h in live.heads]
    assert all(_same_values(a.values, b.values) for a, b in zip(back.heads, live.heads, strict=True))
    for a, b in zip(back.layers, live.layers, strict=True):
        assert (a.block, a.layer, a.n_heads) == (b.block, b.layer, b.n_heads) and _same_values(a.values, b.values)
        np.testing.assert_array_equal(a.head_overlap, b.head_overlap)
    assert back.spectra == {}  # the JSON keeps no singular values


def _figure_data(fig) -> list:
    """What a figure shows, axes by axes: image arrays, line and patch coordinates, texts."""
    out = []
    for ax in fig.get_axes():
        out.append([np.ma.filled(np.ma.asarray(im.get_array(), dtype=float), np.nan) for im in ax.images])
        out.append([line.get_xydata() for line in ax.lines])
        out.append([p.get_path().vertices @ p.get_patch_transform().get_matrix()[:2, :2].T for p in ax.patches])
        out.append([t.get_text() for t in ax.texts] + [ax.get_title(loc=w) for w in ("left", "center", "right")])
    return out + [fig.get_suptitle()]


@pytest.mark.parametrize("kind", [k for k in figures.KINDS if k != "spectra"])
def test_every_figure_is_drawn_from_the_same_data(saved, kind):
    live, _, back = saved
    opts = {"other": None, "metric_name": "shared_qk_distance" if kind == "metric" else None}
    a = figures.figure(live, kind, **{**opts, "other": live if kind == "compare" else None})
    b = figures.figure(back, kind, **{**opts, "other": back if kind == "compare" else None})
    da, db = _figure_data(a), _figure_data(b)
    assert len(da) == len(db)
    for x, y in zip(da, db, strict=True):
        if isinstance(x, list):
            assert len(x) == len(y) and all(np.array_equal(np.asarray(p), np.asarray(q), equal_nan=True)
                                            if not isinstance(p, str) else p == q for p, q in zip(x, y, strict=True))
        else:
            assert x == y


def test_plot_and_report_from_the_file(saved, cli, llama_path, tmp_path):
    from pypdf import PdfReader

    _, path, _ = saved
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    assert cli("plot", path, "--kind", "symmetry", "-o", a).exit_code == 0
    assert cli("plot", llama_path, "--kind", "symmetry", "-o", b).exit_code == 0
    assert a.read_bytes() == b.read_bytes()  # the same figure, pixel for pixel
    r = cli("plot", path, "--kind", "spectra", "-o", tmp_path / "s.png")
    assert r.exit_code == 2 and "needs singular values" in r.stderr and "from the model" in r.stderr
    assert not (tmp_path / "s.png").exists()
    pdf = tmp_path / "r.pdf"
    r = cli("report", path, "-o", pdf)
    assert r.exit_code == 0, r.stderr
    text = " ".join(" ".join(p.extract_text().split()) for p in PdfReader(pdf).pages)
    assert "Could queries and keys share one matrix?" in text and "Figures left out: spectra" in text
    r = cli("plot", path, "--kind", "compare", "--compare", path, "-o", tmp_path / "c.png")
    assert r.exit_code == 0, r.stderr
    r = cli("plot", path, "--fold-ln", "-o", tmp_path / "f.png")
    assert r.exit_code == 2 and "--fold-ln: " in r.stderr and "saved analysis" in r.stderr


def _tamper(path, tmp_path, change) -> str:
    doc = json.loads(path.read_text())
    change(doc)
    out = tmp_path / "bad.json"
    out.write_text(json.dumps(doc))
    return str(out)


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(schema="other/1"), "not a saved analysis"),
    (lambda d: d.update(kind="experiment"), "not a saved analysis"),
    (lambda d: d["heads"][0].update(layer=99), "heads[0].layer = 99 is outside 0..1"),
    (lambda d: d["heads"][1].update(head="x"), "heads[1].head is not an integer"),
    (lambda d: d["heads"][0].update(block="vision"), "heads[0].block 'vision' is not one of the model's blocks"),
    (lambda d: d["heads"][0].update(symmetry="high"), "heads[0].symmetry is not a number"),
    (lambda d: d["layers"][0].update(head_overlap=[[1.0]]), "layers[0].head_overlap is not a 4 × 4 array"),
    (lambda d: d["model"]["blocks"][0].update(n_kv_heads=3), "n_kv_heads = 3 does not divide n_heads = 4"),
    (lambda d: d["model"].pop("blocks"), "model.blocks is missing"),
    (lambda d: d["model"]["blocks"][0].update(n_layers=1 << 19, n_heads=1 << 10, n_kv_heads=1 << 10),
     "layers × 1024 heads is more than 1,048,576"),
    (lambda d: d.update(heads={"a": 1}), "heads is not an array"),
])
def test_a_tampered_file_is_one_line(saved, cli, tmp_path, change, message):
    _, path, _ = saved
    bad = _tamper(path, tmp_path, change)
    for args in (["plot", bad, "-o", tmp_path / "x.png"], ["report", bad, "-o", tmp_path / "x.pdf"]):
        r = cli(*args)
        assert r.exit_code == 2 and message in r.stderr and bad in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json"]  # nothing written


def test_unreadable_oversized_and_broken_files(cli, tmp_path, monkeypatch):
    import qkinspect.analysis.saved as saved_mod

    broken = tmp_path / "broken.json"
    broken.write_text('{"schema": "qkinspect/1", "kind": ')
    r = cli("plot", broken, "-o", tmp_path / "x.png")
    assert r.exit_code == 2 and f"{broken}: a saved analysis is not valid JSON" in r.stderr  # the house's reader
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"schema": "qkinspect/1", "kind": "analyze", "pad": "x" * 5000}))
    monkeypatch.setattr(saved_mod, "MAX_BYTES", 1000)
    r = cli("report", big, "-o", tmp_path / "x.pdf")
    size = big.stat().st_size
    assert r.exit_code == 2 and f"{big}: {size} bytes, more than the" in r.stderr
    assert "a saved analysis may have; refused" in r.stderr
    deep = tmp_path / "deep.json"
    deep.write_text('{"schema": "qkinspect/1", "kind": "analyze", "x": ' + "[" * 50000 + "]" * 50000 + "}")
    r = cli("plot", deep, "-o", tmp_path / "x.png")
    assert r.exit_code == 2 and str(deep) in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_the_library_saves_what_analyze_writes_and_plot_reads(saved, cli, tmp_path):
    """AnalysisResult.save writes the CLI's `analyze -o run.json` byte for byte; document() is that document
    (json.dump of it is a saved analysis too: it was refused, lacking "kind"); plot and report draw both."""
    from pypdf import PdfReader

    live, cli_file, _ = saved
    mine = live.save(tmp_path / "lib.json")
    assert mine == tmp_path / "lib.json" and mine.read_bytes() == cli_file.read_bytes()
    dumped = tmp_path / "dumped.json"
    dumped.write_text(json.dumps(live.document()))
    assert live.document()["kind"] == "analyze" and json.loads(cli_file.read_text()) == live.document()
    for path in (mine, dumped):
        png = tmp_path / f"{path.stem}.png"
        r = cli("plot", path, "--kind", "overlap", "-o", png)
        assert r.exit_code == 0, r.stderr
        r = cli("report", path, "-o", tmp_path / f"{path.stem}.pdf")
        assert r.exit_code == 0, r.stderr
        assert "qkinspect report" in PdfReader(tmp_path / f"{path.stem}.pdf").pages[0].extract_text()
    back = read_saved(dumped)
    assert back.model == live.model and [h.values.keys() for h in back.heads] == [h.values.keys() for h in live.heads]
