"""The atlas says what it measured (issue 39): q/k-norm models measured raw are flagged (or folded with
--fold-qk-norm), every overlap has its chance level beside it, models are named as `info` names them, and an --out
folder that is not an atlas's is refused. Synthetic documents where no model is needed; no Dask cluster."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from qkinspect.atlas.stats import entry_stats
from qkinspect.errors import InputError
from tests.atlas.synthetic import synthetic_atlas, synthetic_doc
from tests.one_line import one_error_line


def _doc(qk_norm: bool, folded: bool, chance: float | None = None) -> dict:
    doc = synthetic_doc(1, np.random.default_rng(2))  # a llama-like decoder
    for b in doc["model"]["blocks"]:
        b["qk_norm"] = qk_norm
    doc["processing"] = {"fold_qk_norm": folded}
    if chance is not None:
        doc["baselines"] = [{"block": "decoder", "metric": "overlap_qk", "mean": chance, "std": 0.01, "n": 8},
                            {"block": "decoder", "metric": "symmetry", "mean": 0.001, "std": 0.002, "n": 8}]
    return doc


@pytest.mark.parametrize(("qk_norm", "folded", "raw"), [(True, False, True), (True, True, False),
                                                         (False, False, False)])
def test_a_q_k_norm_block_measured_raw_is_flagged_in_the_facts(qk_norm, folded, raw):
    _, facts = entry_stats("m", _doc(qk_norm, folded))
    assert [f["qk_norm_raw"] for f in facts] == [raw]


def test_the_table_marks_raw_q_k_norm_rows_and_says_why():
    from qkinspect.terminal.atlas import atlas_tables

    atlas = synthetic_atlas(3)
    atlas.facts[1]["qk_norm_raw"] = True
    from rich.console import Console

    tables, lines = atlas_tables(atlas.rows(), width=80)
    assert any(line.startswith("* q/k norms not folded") and "--fold-qk-norm" in line for line in lines)
    console = Console(width=80, record=True, color_system=None)
    console.print(tables[0])
    marked = [line.split()[1] for line in console.export_text().splitlines()[2:] if line.strip()]
    assert [b.endswith("*") for b in marked] == [i == 1 for i in range(len(atlas.facts))], marked


def test_fold_qk_norm_is_an_atlas_option_and_folds_only_where_there_are_norms(zoo):
    import inspect

    import qkinspect
    from qkinspect.atlas.request import atlas_options
    from qkinspect.sweep.task import analyze_checkpoint

    assert atlas_options({"fold_qk_norm": True})["fold_qk_norm"] is True
    assert "fold_qk_norm" in inspect.signature(qkinspect.atlas).parameters
    # a model without q/k norms among them is measured as stored, not refused (analyze refuses the option alone)
    done = analyze_checkpoint(str(zoo["bert"]), None, {"metrics": ["symmetry"], "fold_qk_norm": True}, threads=1)
    assert done["result"]["processing"]["fold_qk_norm"] is False


def test_a_raw_q_k_norm_model_is_noted_and_folding_it_clears_the_note(tmp_path):
    """A Qwen3 model through the atlas's own reading: raw, the note and the flag; folded, neither."""
    import qkinspect
    from qkinspect.atlas.inputs import entries
    from qkinspect.atlas.run import run_atlas
    from qkinspect.atlas.saved import read_atlas
    from tests.cli.test_fold_qk_norm import save_qwen3

    model = save_qwen3(tmp_path / "qwen3", seed=7)

    for folded in (False, True):
        saved = tmp_path / f"q{folded}.json"
        qkinspect.analyze(model, metrics=["symmetry", "overlap"], layer_form=True,
                          fold_qk_norm=folded).save(saved)
        run_atlas(entries([str(saved)]), {"metrics": ["symmetry"]}, tmp_path / f"atlas{folded}")
        atlas = read_atlas(tmp_path / f"atlas{folded}")
        assert {f["qk_norm_raw"] for f in atlas.facts} == {not folded}
        assert any("q/k norms not folded" in n for n in atlas.notes) is (not folded)


def test_every_overlap_record_has_its_chance_level_and_the_ratio():
    records, _ = entry_stats("m", _doc(False, False, chance=0.25))
    ov = [r for r in records if r.metric == "overlap_qk"]
    assert ov and all(r.chance == 0.25 and r.vs_chance == pytest.approx(r.median / 0.25) for r in ov)
    # symmetry's chance is ≈ 0, of either sign: kept, but no ratio to it
    assert all(r.chance == 0.001 and r.vs_chance is None for r in records if r.metric == "symmetry")
    assert all(r.chance is None for r in records if r.metric == "symmetry_layer")


def test_the_table_shows_the_chance_level_and_offers_the_ratio():
    from rich.console import Console

    from qkinspect.terminal.atlas import atlas_tables

    atlas = synthetic_atlas(2)
    atlas.records = [replace(r, chance=0.125) if r.metric == "overlap_qk" else r for r in atlas.records]
    text = {}
    for vs in (False, True):
        tables, lines = atlas_tables(atlas.rows(), width=80, vs_chance=vs)
        console = Console(width=80, record=True, color_system=None)
        for t in tables:
            console.print(t)
        text[vs] = console.export_text()
        assert any(line.startswith("chance: ") for line in lines)
    assert "chance" in text[False] and "0.125" in text[False]
    ratio = atlas.rows()[0]["overlap_qk"] / 0.125
    assert f"{ratio:.3f}" in text[True] and "ovl_qk/ch" in text[True]


def test_models_are_named_as_info_names_them_and_keep_their_path():
    from qkinspect.atlas.saved import display_names

    docs = [("/x/site-packages/pkg/model", {"model": {"name": "all-MiniLM-L6-v2"}}),
            ("/tmp/a/model", {"model": {"name": "model"}}), ("/tmp/b/model", {"model": {"name": "model"}}),
            ("failed/one", None)]
    assert display_names(docs) == ["all-MiniLM-L6-v2", "model", "model (2)", "failed/one"]
    records, facts = entry_stats("all-MiniLM-L6-v2", synthetic_doc(0, np.random.default_rng(0)),
                                 path="/x/site-packages/pkg/model")
    assert {r.model for r in records} == {"all-MiniLM-L6-v2"}
    assert {r.path for r in records} == {f["path"] for f in facts} == {"/x/site-packages/pkg/model"}


@pytest.mark.parametrize("what", ["foreign", "sweep"])
def test_out_into_a_folder_that_is_not_an_atlas_is_refused(zoo, cli, tmp_path, what):
    out = tmp_path / "out"
    out.mkdir()
    if what == "sweep":
        (out / "sweep.json").write_text(json.dumps({"kind": "sweep"}))
        (out / "results").mkdir()
    else:
        (out / "thesis.tex").write_text("mine")
    before = sorted(p.name for p in out.iterdir())
    r = cli("atlas", zoo["bert"], "--out", out)
    one_error_line(r, f"--out {out}: ", "sweep folder" if what == "sweep" else "not an atlas folder")
    assert sorted(p.name for p in out.iterdir()) == before
    import qkinspect

    with pytest.raises(InputError, match=f"^out='{out}': "):
        qkinspect.atlas([str(zoo["bert"])], out=out)
