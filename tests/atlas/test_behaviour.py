"""The atlas with behaviour scores (`behaviour=True`, `--behaviour`): `heads` run inside each model's atlas task.
Each model's relations in the atlas equal `qkinspect.heads` run on that model alone (every number), its per-layer
score records are the medians of heads' own per-head scores; a re-run resumes; other amounts are other results;
a stored result whose relations are tampered with is refused and computed again; a model `heads` cannot run keeps
its weight records and gets a note; the relations table fits 80 columns; an atlas without the option is as it was
(no score, no relations, the options and keys of before)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import qkinspect
from tests.atlas.conftest import NEEDS_DASK
from tests.experiment import tiny_models
from tests.one_line import one_error_line

pytest.importorskip("distributed", reason=NEEDS_DASK)

AMOUNTS = dict(sequences=6, length=12)
# what the atlas runs heads with (qkinspect.atlas.behaviour), besides AMOUNTS
HEADS = dict(windows=8, window=64, batch=8, seed=0, resamples=1000, permutations=1000)


@pytest.fixture(scope="module")
def models(tmp_path_factory, zoo):
    root = tmp_path_factory.mktemp("behaviour")
    return {"llama": tiny_models.llama(root / "llama"), "bert": tiny_models.bert(root / "bert"), "bart": zoo["bart"]}


@pytest.fixture(scope="module")
def built(models, tmp_path_factory):
    from qkinspect.atlas.run import build_atlas

    out = tmp_path_factory.mktemp("atlas") / "out"
    outcome = build_atlas([str(models[m]) for m in ("llama", "bert", "bart")], out=out, workers=1, behaviour=True,
                          **AMOUNTS)
    return out, outcome


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_each_models_relations_are_heads_run_on_it_alone(built, models, name):
    out, _ = built
    atlas = qkinspect.read_atlas(out)
    path = str(models[name])
    alone = qkinspect.heads(path, **AMOUNTS, **HEADS)
    mine = [r for r in atlas.relations if r.path == path]
    want = [r for r in alone.relations if r.scope in ("all", "within")]
    assert len(mine) == len(want) > 0
    for got, w in zip(mine, want, strict=True):
        assert (got.metric, got.score, got.scope, got.n) == (w.metric, w.score, w.scope, w.n)
        assert (got.rho, got.low, got.high, got.p) == (w.rho, w.low, w.high, w.p)
    assert {r.metric for r in mine} == {"symmetry", "overlap_qk", "qk_effective_rank"}
    # the scores' per-layer records: the median over heads' own scores of that layer
    for score in alone.scores:
        for layer in range(alone.model.blocks[0].n_layers):
            values = [r.scores[score] for r in alone.records if r.layer == layer]
            rec = next(r for r in atlas.records if r.path == path and r.metric == score and r.layer == layer)
            assert rec.median == pytest.approx(float(np.median(values)), abs=1e-12)
            assert rec.n == len(values)
    has_induction = any(r.metric == "induction" for r in atlas.records if r.path == path)
    assert has_induction == (name == "llama")  # an encoder has no induction score


def test_a_model_heads_cannot_run_keeps_its_weights_and_says_why(built, models):
    out, outcome = built
    assert not outcome.failures
    atlas = qkinspect.read_atlas(out)
    bart = str(models["bart"])
    metrics = {r.metric for r in atlas.records if r.path == bart}
    assert "symmetry" in metrics and "induction" not in metrics and "previous_token" not in metrics
    assert not [r for r in atlas.relations if r.path == bart]
    assert any(n.startswith(f"{bart}: no behaviour scores:") and "one attention block" in n for n in atlas.notes)


def test_a_rerun_resumes_and_other_amounts_are_other_results(built, models, tmp_path):
    import shutil

    from qkinspect.atlas.run import build_atlas

    out, _ = built
    specs = [str(models[m]) for m in ("llama", "bert", "bart")]
    again = build_atlas(specs, out=out, workers=1, behaviour=True, **AMOUNTS)
    assert again.computed == [] and sorted(again.skipped) == sorted(specs)
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    other = build_atlas(specs[:1], out=copy, workers=1, behaviour=True, sequences=5, length=12)
    assert other.computed == specs[:1]
    plain = build_atlas(specs[:1], out=copy, workers=1)  # without behaviour: another result too
    assert plain.computed == specs[:1]
    assert not qkinspect.read_atlas(copy).relations


def test_a_tampered_relation_is_refused_and_computed_again(built, models, tmp_path):
    import shutil

    from qkinspect.atlas.run import build_atlas

    out, _ = built
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    files = [p for p in (copy / "models" / "results").iterdir() if "relations" in p.read_text()]
    doc = json.loads(files[0].read_text())
    doc["result"]["relations"][0]["rho"] = 2.0
    files[0].write_text(json.dumps(doc))
    why = []
    done = build_atlas([str(models[m]) for m in ("llama", "bert", "bart")], out=copy, workers=1, behaviour=True,
                       notice=why.append, **AMOUNTS)
    assert len(done.computed) == 1 and len(why) == 1 and "relations[0].rho" in why[0]
    assert qkinspect.read_atlas(copy).relation_rows() == qkinspect.read_atlas(out).relation_rows()


def test_the_relations_table_fits_80_columns_and_the_rows_are_relations(built, models):
    from typer.testing import CliRunner

    from qkinspect.cli.app import app

    out, _ = built
    args = ["atlas", *[str(models[m]) for m in ("llama", "bert", "bart")], "--out", str(out), "--behaviour",
            "--sequences", "6", "--length", "12", "--relations"]
    table = CliRunner().invoke(app, [*args, "-f", "table"], env={"COLUMNS": "80"}, terminal_width=80)
    assert table.exit_code == 0, table.output
    assert "continued" not in table.output and "ρ within layers" in table.output
    assert max(len(x) for x in table.stdout.splitlines()) <= 80
    assert "models: 1=llama, 2=bert" in table.stdout
    csv = CliRunner().invoke(app, [*args, "-f", "csv"])
    assert csv.exit_code == 0, csv.output
    rows = csv.stdout.splitlines()
    assert rows[0] == "model,block,metric,score,scope,rho,low,high,p,n,path"
    assert len(rows) - 1 == len(qkinspect.read_atlas(out).relations)


def test_amounts_without_behaviour_and_bad_amounts_are_one_line(models, tmp_path):
    from typer.testing import CliRunner

    from qkinspect.cli.app import app

    for extra, words in ((["--sequences", "4"], "--sequences 4: an amount of the behaviour scores; give "
                                                 "--behaviour too"),
                         (["--behaviour", "--length", "1"], "--length 1: expected 2 to")):
        r = CliRunner().invoke(app, ["atlas", str(models["llama"]), "--out", str(tmp_path / "x"), *extra])
        assert r.exit_code == 2, r.output
        assert words in one_error_line(r)
    assert not (tmp_path / "x").exists()


def test_without_the_option_the_atlas_is_as_it_was(models, tmp_path):
    from qkinspect.atlas.run import build_atlas
    from qkinspect.sweep.keys import OPTION_NAMES

    build_atlas([str(models["llama"])], out=tmp_path / "out", workers=1)
    atlas = qkinspect.read_atlas(tmp_path / "out")
    assert "relations" not in atlas.document() and "behaviour" not in atlas.options
    assert not {"previous_token", "induction", "self"} & set(atlas.metrics)
    manifest = json.loads((tmp_path / "out" / "models" / "sweep.json").read_text())
    assert set(manifest["options"]) == set(OPTION_NAMES)


def test_a_saved_heads_document_brings_its_relations(models, tmp_path):
    from qkinspect.atlas.run import build_atlas

    alone = qkinspect.heads(str(models["llama"]), **AMOUNTS, **{**HEADS, "resamples": 100, "permutations": 100})
    alone.save(tmp_path / "h.json")
    build_atlas([str(tmp_path / "h.json")], out=tmp_path / "out")
    atlas = qkinspect.read_atlas(tmp_path / "out")
    want = [(r.metric, r.score, r.scope, r.rho, r.p) for r in alone.relations if r.scope != "layer"]
    assert [(r.metric, r.score, r.scope, r.rho, r.p) for r in atlas.relations] == want
    assert atlas.relations[0].path == str(tmp_path / "h.json")
