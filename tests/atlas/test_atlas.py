"""The atlas on a real Dask cluster (a `dask scheduler` and `dask worker` processes on 127.0.0.1): three families,
shapes and formats in one atlas, each entry's numbers against an independent computation from `analyze`'s head
records and from the model's own tensors; saved analyses as entries; failures; bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from qkinspect.errors import InputError
from tests.atlas.conftest import NEEDS_DASK
from tests.one_line import one_error_line

pytest.importorskip("distributed", reason=NEEDS_DASK)

METRICS = "symmetry,overlap,directionality,qk_effective_rank"


@pytest.fixture(scope="module")
def built(cluster, zoo, tmp_path_factory):
    """One atlas of the three models through --scheduler: (folder, CLI result)."""
    from typer.testing import CliRunner

    from qkinspect.cli.app import app

    out = tmp_path_factory.mktemp("atlas") / "out"
    r = CliRunner().invoke(app, ["atlas", str(zoo["bert"]), str(zoo["llama"]), str(zoo["bart"]), "--scheduler",
                                 cluster.address, "--out", str(out), "--metrics", METRICS, "-f", "json"])
    return out, r


def independent(model, metrics: list[str]) -> dict:
    """(block, metric, layer) -> sorted finite head values, and (block, metric, layer) -> layer-form value, from
    `analyze`'s own records; the numbers the atlas must summarise."""
    import qkinspect

    result = qkinspect.analyze(model, metrics=metrics, layer_form=True)
    heads: dict = {}
    for h in result.heads:
        for m, v in h.values.items():
            if math.isfinite(v):
                heads.setdefault((h.block, m, h.layer), []).append(v)
                heads.setdefault((h.block, m, None), []).append(v)
    form = {(r.block, m, r.layer): r.values[m] for r in result.layers for m in ("symmetry_layer",
                                                                                 "directionality_layer")}
    return {"heads": heads, "form": form, "info": result.model}


def test_each_entry_equals_an_independent_computation(built, zoo):
    out, r = built
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["kind"] == "atlas" and doc["paths"] == [str(zoo[k]) for k in ("bert", "llama", "bart")]
    assert "note: 3 computed, 0 already in" in r.stderr
    from tests.cli.schema import validate

    validate(doc)
    records = doc["records"]
    assert set(records[0]) == {"model", "block", "metric", "scope", "layer", "depth", "median", "q1", "q3", "n",
                               "chance", "vs_chance", "path"}
    for name in ("bert", "llama", "bart"):
        want = independent(zoo[name], METRICS.split(","))
        mine = [x for x in records if x["path"] == str(zoo[name])]
        assert {x["block"] for x in mine} == {b.key for b in want["info"].blocks}
        checked = 0
        for x in mine:
            key = (x["block"], x["metric"], x["layer"])
            if x["metric"] in ("symmetry_layer", "directionality_layer"):
                values = [want["form"][key]] if x["scope"] == "layer" else \
                    [v for (b, m, _), v in want["form"].items() if (b, m) == key[:2]]
            else:
                values = want["heads"][key]
            values = np.sort(np.asarray(values, dtype=np.float64))
            n = len(values)
            median = (values[(n - 1) // 2] + values[n // 2]) / 2  # by hand, not np.median
            assert x["n"] == n and x["median"] == pytest.approx(median, rel=1e-12, abs=1e-12), x
            assert x["q1"] <= x["median"] <= x["q3"]
            checked += 1
        # every head metric of every block at both scopes, and the layer form
        assert checked == len(mine) and any(x["metric"] == "symmetry_layer" for x in mine)
        import qkinspect

        chance = qkinspect.analyze(zoo[name], metrics=METRICS.split(","), layers="0").baselines
        named = doc["models"][doc["paths"].index(str(zoo[name]))]
        assert [b for b in doc["baselines"] if b["model"] == named] == [
            {"model": named, "block": b.block, "metric": b.metric, "mean": pytest.approx(b.mean, abs=1e-12),
             "std": pytest.approx(b.std, abs=1e-12), "n": b.n} for b in chance]


def test_depth_runs_from_0_to_1_in_every_entry(built, zoo):
    out, r = built
    doc = json.loads(r.stdout)
    for fact in doc["facts"]:
        layer_records = [x for x in doc["records"] if x["model"] == fact["model"] and x["block"] == fact["block"]
                         and x["scope"] == "layer" and x["metric"] == "symmetry"]
        depths = sorted(x["depth"] for x in layer_records)
        L = fact["layers"]
        assert [x["layer"] for x in sorted(layer_records, key=lambda x: x["layer"])] == list(range(L))
        assert depths == pytest.approx([i / (L - 1) for i in range(L)]) and depths[0] == 0 and depths[-1] == 1
    assert all(x["depth"] is None and x["layer"] is None for x in doc["records"] if x["scope"] == "model")


def test_facts_are_the_models_own(built, zoo):
    """Shapes from each model's tensors as the loader gives them, the attention parameter count by counting."""
    from qkinspect.loading import open_model

    doc = json.loads(built[1].stdout)
    facts = {(f["path"], f["block"]): f for f in doc["facts"]}
    assert [(f["block"], f["kind"]) for f in doc["facts"] if f["path"] == str(zoo["bart"])] == [
        ("encoder", "encoder"), ("decoder", "decoder"), ("cross", "cross")]
    for name, family in (("bert", "bert"), ("llama", "llama"), ("bart", "bart")):
        with open_model(zoo[name]) as m:
            counted: dict = {}
            for layer in m.layers(need_o=True):
                n = sum(t.numel() for t in (layer.W_Q, layer.W_K, layer.W_V, layer.W_O))
                counted[layer.block] = counted.get(layer.block, 0) + n
                f = facts[(str(zoo[name]), layer.block)]
                assert (f["heads"], f["kv_heads"], f["d_model"], f["d_head"]) == (
                    layer.W_Q.shape[0], layer.W_K.shape[0], layer.W_Q.shape[1], layer.W_Q.shape[2])
                assert f["family"] == family
        for block, n in counted.items():
            assert facts[(str(zoo[name]), block)]["attention_params"] == n
    llama = facts[(str(zoo["llama"]), "decoder")]
    assert (llama["format"], llama["positional"], llama["heads"], llama["kv_heads"]) == ("gguf", "rope", 4, 2)


def test_the_layer_form_pairs_query_head_h_with_kv_head_h_over_rep(built, zoo):
    """symmetry_layer of the GQA model is the summed form with h // rep, and differs from the tiled h % n_kv."""
    from qkinspect.loading import open_model

    doc = json.loads(built[1].stdout)
    got = {x["layer"]: x["median"] for x in doc["records"] if x["path"] == str(zoo["llama"])
           and x["metric"] == "symmetry_layer" and x["scope"] == "layer"}
    with open_model(zoo["llama"]) as m:
        for layer in m.layers():
            Q, K = layer.W_Q.double(), layer.W_K.double()
            H, G = Q.shape[0], K.shape[0]

            def sym(pairing, Q=Q, K=K, H=H):
                M = sum(Q[h] @ K[pairing[h]].T for h in range(H))
                return float((M * M.T).sum() / (M * M).sum())

            right, tiled = sym([h // (H // G) for h in range(H)]), sym([h % G for h in range(H)])
            assert got[layer.layer] == pytest.approx(right, abs=1e-5)
            assert abs(right - tiled) > 1e-3  # the pairing matters, so the test can tell them apart


def test_plot_and_report_read_the_atlas_folder(built, cli, tmp_path):
    pypdf = pytest.importorskip("pypdf")
    out, _ = built
    r = cli("plot", out, "-o", tmp_path / "d.png")
    assert r.exit_code == 0, r.stderr
    assert r.stderr.strip() == f"note: wrote the symmetry depth figure to {tmp_path / 'd.png'}"
    r = cli("plot", out, "--kind", "size", "--metric", "overlap_qk", "-o", tmp_path / "s.svg")
    assert r.exit_code == 0, r.stderr
    assert (tmp_path / "s.svg").read_text().count("<svg") == 1
    r = cli("report", out, "-o", tmp_path / "a.pdf")
    assert r.exit_code == 0, r.stderr
    pages = pypdf.PdfReader(tmp_path / "a.pdf").pages
    assert len(pages) == 1 + 7 + 3  # the cover, 7 metrics against depth, 3 against size
    assert r.stderr.strip() == f"note: wrote an 11-page atlas report to {tmp_path / 'a.pdf'}"
    cover = pages[0].extract_text()
    assert "qkinspect atlas report" in cover and "3 models, 3 with results, 0 failed; 5 blocks" in cover
    assert "normalised depth" in pages[1].extract_text()
    r = cli("report", out, "--html", "-o", tmp_path / "a.html")
    assert r.exit_code == 0, r.stderr
    assert r.stderr.strip() == f"note: wrote an HTML atlas report to {tmp_path / 'a.html'}"
    page = (tmp_path / "a.html").read_text()
    assert page.count("<svg") == 11 - 1 and page.count("<tr>") == 1 + 5  # the figures; a row per model and block
    one_error_line(cli("plot", out, "--kind", "depth", "--metric", "nope", "-o", tmp_path / "x.png"),
                   "--metric nope: the atlas does not hold it")
    one_error_line(cli("plot", out, "--kind", "rank", "-o", tmp_path / "x.png"), "--kind depth or --kind size")
    # --kind symmetry (plot's default for a model) once drew the depth figure: refused now, as every kind that
    # an atlas folder does not draw
    one_error_line(cli("plot", out, "--kind", "symmetry", "-o", tmp_path / "x.png"), "--kind depth or --kind size")


@pytest.mark.parametrize(("damage", "says"), [
    (lambda d: d.update(kind="sweep"), 'not a qkinspect atlas manifest (no "kind": "atlas")'),
    (lambda d: d["entries"][0].update(entry="other"), "entries[0].entry"),
    (lambda d: d["entries"][0].update(entry="saved", file="../../etc/passwd"), "entries[0].file"),
    (lambda d: d.update(entries="all"), "entries"),
])
def test_a_damaged_atlas_folder_is_one_line(built, cli, tmp_path, damage, says):
    import shutil

    out = shutil.copytree(built[0], tmp_path / "out")
    doc = json.loads((out / "atlas.json").read_text())
    damage(doc)
    (out / "atlas.json").write_text(json.dumps(doc))
    one_error_line(cli("plot", out, "-o", tmp_path / "x.png"), str(out / "atlas.json"), says)
    one_error_line(cli("report", out, "-o", tmp_path / "x.pdf"), says)
    assert not (tmp_path / "x.png").exists() and not (tmp_path / "x.pdf").exists()


def test_the_library_reads_what_the_cli_wrote(built, zoo):
    pd = pytest.importorskip("pandas")
    import qkinspect

    out, r = built
    atlas = qkinspect.read_atlas(out)
    assert [x.row() for x in atlas.records] == json.loads(r.stdout)["records"]
    df = atlas.to_pandas()
    assert list(df.columns) == ["model", "block", "metric", "scope", "layer", "depth", "median", "q1", "q3", "n",
                                "chance", "vs_chance", "path"]
    one = df[(df.metric == "symmetry") & (df.scope == "model")]
    assert len(one) == 5 and isinstance(one, pd.DataFrame)
    assert len(atlas.to_pandas("models")) == 5
    html = atlas._repr_html_()
    assert html.count("<tr>") == 1 + 5 and "symmetry" in html


def test_relative_paths_read_from_another_folder(cluster, zoo, cli, tmp_path, monkeypatch):
    """Models named relative to the working folder; the atlas read back from elsewhere is the same atlas."""
    import shutil

    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(zoo["bert"], work / "bert")
    (work / "zoo").symlink_to(zoo["bart"])  # a link, as docs/atlas.md makes them
    monkeypatch.chdir(work)
    r = cli("atlas", "bert", "zoo", "--scheduler", cluster.address, "--out", "out", "--metrics", "symmetry",
            "-f", "json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["paths"] == ["bert", "zoo"] and doc["models"] == ["bert", "bart"]  # named as `info` names them
    monkeypatch.chdir(tmp_path)
    r = cli("plot", "work/out", "-o", "d.png")
    assert r.exit_code == 0, r.stderr
    import qkinspect

    assert [x.row() for x in qkinspect.read_atlas("work/out").records] == doc["records"]


def test_records_as_parquet_csv_and_ndjson(built, zoo, cli, tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    out, r = built
    records = json.loads(r.stdout)["records"]
    models = [str(zoo[k]) for k in ("bert", "llama", "bart")]
    for name in ("a.parquet", "a.csv", "a.ndjson"):
        # every model is in the folder: nothing is computed, no cluster is asked
        r = cli("atlas", *models, "--out", out, "--metrics", METRICS, "-o", tmp_path / name)
        assert r.exit_code == 0, r.stderr
        assert "note: 0 computed, 3 already in" in r.stderr
    got = pd.read_parquet(tmp_path / "a.parquet")
    assert list(got.columns) == list(records[0]) and len(got) == len(records)
    assert got["median"].tolist() == pytest.approx([x["median"] for x in records], rel=1e-12)
    assert pd.read_csv(tmp_path / "a.csv")["n"].tolist() == [x["n"] for x in records]
    assert [json.loads(line) for line in (tmp_path / "a.ndjson").read_text().splitlines()] == records


def test_a_saved_analysis_is_an_entry_with_nothing_recomputed(cluster, zoo, cli, tmp_path):
    import qkinspect

    saved = tmp_path / "bert.json"
    r = cli("analyze", zoo["bert"], "--metrics", METRICS, "--layer-form", "-o", saved)
    assert r.exit_code == 0, r.stderr
    bare = tmp_path / "bare.json"
    assert cli("analyze", zoo["bart"], "--metrics", "symmetry", "-o", bare).exit_code == 0
    r = cli("atlas", saved, zoo["llama"], bare, "--scheduler", cluster.address, "--out", tmp_path / "out",
            "--metrics", METRICS, "-f", "json")
    assert r.exit_code == 0, r.stderr
    assert "note: 1 computed, 0 already in" in r.stderr and "2 saved analyses" in r.stderr
    assert f"note: {bare}: saved without the layer form, so it has no layer-form records" in r.stderr
    assert len(list((tmp_path / "out" / "models" / "results").glob("*.json"))) == 1  # only the llama analysed
    doc = json.loads(r.stdout)
    assert doc["paths"] == [str(saved), str(zoo["llama"]), str(bare)]
    from qkinspect.atlas.stats import entry_stats

    expected, _ = entry_stats(doc["models"][0], json.loads(saved.read_text()), "saved", path=str(saved))
    assert [x for x in doc["records"] if x["path"] == str(saved)] == [x.row() for x in expected]
    assert {f["entry"] for f in doc["facts"] if f["path"] == str(saved)} == {"saved"}
    assert not [x for x in doc["records"] if x["path"] == str(bare) and x["metric"] == "symmetry_layer"]
    saved.unlink()  # the atlas keeps its own copy: the folder alone draws it
    assert len(qkinspect.read_atlas(tmp_path / "out").facts) == 1 + 1 + 3


def test_a_model_that_fails_is_reported_and_the_others_kept(cluster, zoo, cli, tmp_path):
    import shutil

    bad = tmp_path / "broken"
    shutil.copytree(zoo["bert"], bad)
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])  # truncated
    r = cli("atlas", zoo["bert"], bad, zoo["bart"], "--scheduler", cluster.address, "--out", tmp_path / "out",
            "--metrics", "symmetry", "-f", "ndjson")
    assert r.exit_code == 3, r.stderr  # a model failed: neither bad input (2) nor a bug (1)
    assert r.stderr.strip().splitlines()[-1].startswith("error: 1 of 3 models failed")
    assert f"warning: failed: {bad}: " in r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert {x["path"] for x in rows} == {str(zoo["bert"]), str(zoo["bart"])}
    manifest = json.loads((tmp_path / "out" / "atlas.json").read_text())
    assert [f["model"] for f in manifest["failures"]] == [str(bad)]


@pytest.mark.parametrize(("args", "says"), [
    (["/no/such/model"], "/no/such/model: no such file or folder"),
    (["--from", "/no/such/list.txt"], "/no/such/list.txt"),
    (["--from", "EMPTY"], "error: --from EMPTY: names no model"),
    ([], "error: atlas: no models given (MODEL arguments, --from or --hf-cache)"),
    (["NOT_ANALYSIS"], "not a saved analysis"),
    (["BERT", "--metrics", "nope"], "unknown metric 'nope'"),
    (["BERT", "--precision", "float16"], "float16"),
    (["BERT", "--workers", "0"], "error: --workers: 0 must be at least 1"),
    (["BERT", "--scheduler", "DEAD"], "error: --scheduler DEAD: cannot connect"),
])
def test_bad_input_is_one_line_and_writes_nothing(zoo, cli, tmp_path, args, says):
    import socket

    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [f"tcp://127.0.0.1:{port}" if a == "DEAD" else a for a in args]
    (tmp_path / "EMPTY").write_text("# nothing\n\n")
    (tmp_path / "NOT_ANALYSIS.json").write_text('{"schema": "qkinspect/1", "kind": "sweep"}')
    subst = {"EMPTY": str(tmp_path / "EMPTY"), "NOT_ANALYSIS": str(tmp_path / "NOT_ANALYSIS.json"),
             "BERT": str(zoo["bert"])}
    subst["DEAD"] = args[args.index("--scheduler") + 1] if "--scheduler" in args else "DEAD"
    r = cli("atlas", *[subst.get(a, a) for a in args], "--out", tmp_path / "out")
    one_error_line(r, _put(says, subst))
    assert not (tmp_path / "out").exists()


def _put(text: str, subst: dict[str, str]) -> str:
    for k, v in subst.items():
        text = text.replace(k, v)
    return text


def test_the_library_names_its_own_arguments(zoo, tmp_path):
    """What the CLI says with its options (above), the library says with its arguments."""
    import qkinspect

    (tmp_path / "empty.txt").write_text("# nothing\n")
    for kwargs, says in (({}, "^atlas: no models given \\(models, from_file or hf_cache\\)$"),
                         ({"from_file": tmp_path / "empty.txt"}, f"^from_file='{tmp_path / 'empty.txt'}': names no"),
                         ({"models": [str(zoo["bert"])], "workers": 0}, "^workers: 0 must be at least 1$")):
        with pytest.raises(InputError, match=says):
            qkinspect.atlas(out=tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()
