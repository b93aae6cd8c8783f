"""Results in a notebook: an analysis and a sweep show their terminal tables as HTML when they are a cell's value,
with every row, and `to_pandas()` gives one row per record with the documented columns; without pandas it says
how to get it. (The experiment result: tests/experiment/test_notebook_experiment.py.)"""

from __future__ import annotations

import html
import re
import sys

import pytest
import torch

import qkinspect
from qkinspect.notebook import data_frame, html_table


def text_of(fragment: str) -> str:
    """What a reader sees of an HTML fragment: the text, tags dropped, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def rows_of(fragment: str) -> list[list[str]]:
    return [line.split() for line in text_of(fragment).splitlines()]


@pytest.fixture(scope="module")
def minilm():
    demo = pytest.importorskip("qkinspect.demo")
    try:
        return demo.demo_path()
    except Exception as e:  # noqa: BLE001 (the demo extra is absent)
        pytest.skip(str(e))


def test_an_analysis_shows_its_tables_with_every_head(minilm):
    r = qkinspect.analyze(minilm, layers=[0, 5], metrics=["symmetry", "overlap_qk"])
    fragment = r._repr_html_()
    assert fragment.startswith("<pre") and fragment.rstrip().endswith("</pre>")
    assert "<span style=" in fragment  # the colours of the terminal table
    rows = rows_of(fragment)
    for h in r.heads:
        want = [str(h.layer), str(h.head), f"{h.values['symmetry']:.3f}", f"{h.values['overlap_qk']:.3f}"]
        assert want in rows, want  # each head's row, as the terminal shows it
    for layer in r.layers:
        assert any(row[:2] == [str(layer.layer), "12"] for row in rows)  # the per-layer table
    assert "random baseline" in text_of(fragment)


def test_analysis_to_pandas_is_the_csv_rows(minilm):
    pytest.importorskip("pandas")
    r = qkinspect.analyze(minilm, layers=[0, 5], metrics=["symmetry", "overlap_qk"])
    df = r.to_pandas()
    assert len(df) == len(r.heads) == 24
    assert list(df.columns[:5]) == ["model", "block", "layer", "head", "kv_head"]
    assert {"symmetry", "overlap_qk"} <= set(df.columns)
    assert df["symmetry"].tolist() == [h.values["symmetry"] for h in r.heads]
    assert len(r.to_pandas("layer")) == 2


def _sweep_folder(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from qkinspect.callback import Tracker
    from qkinspect.sweep import read_sweep

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=8, intermediate_size=48, vocab_size=30))
    tracker = Tracker(tmp_path / "sweep", metrics=["symmetry"], name="tiny")
    for step in (0, 5):
        tracker.measure(model, step)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
    return read_sweep(tmp_path / "sweep")


def test_a_sweep_shows_its_table_and_is_one_frame(tmp_path):
    folder = _sweep_folder(tmp_path)
    rows = rows_of(folder._repr_html_())
    for r in folder.rows():
        assert any(r["checkpoint"] in " ".join(row) and f"{r['symmetry']:.3f}" in row for row in rows), r
    pytest.importorskip("pandas")
    df = folder.to_pandas()
    assert len(df) == len(folder.rows()) == 2 * 2 * 4  # 2 steps x 2 layers x 4 heads
    assert list(df.columns[:2]) == ["checkpoint", "step"] and {"layer", "head", "symmetry"} <= set(df.columns)
    assert sorted(set(df["step"])) == [0, 5]


def test_without_pandas_the_error_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # as if it were not installed
    with pytest.raises(ImportError, match="pip install pandas"):
        data_frame([{"a": 1}])


def test_data_frame_keeps_the_rows_and_their_column_order():
    pytest.importorskip("pandas")
    df = data_frame([{"b": 1, "a": 2}, {"b": 3, "c": 4}])
    assert list(df.columns) == ["b", "a", "c"] and len(df) == 2
    assert df["c"].isna().tolist() == [True, False]


def test_html_table_is_the_render_at_notebook_width():
    def render(console):
        console.print("x" * 150)

    text = text_of(html_table(render, width=100))
    assert [len(line) for line in text.splitlines() if line] == [100, 50]


# -- every result the library returns: a table in a notebook, one frame, and save() = what -o writes (issue 39) -------

def _results(minilm, tmp_path):
    """(name, result, the CLI's Document of it) for every result type the library returns."""
    from qkinspect.cli.commands.analyze import analysis_document
    from qkinspect.cli.commands.atlas import atlas_document
    from qkinspect.cli.commands.composition import composition_document
    from qkinspect.cli.commands.directions import directions_document
    from qkinspect.cli.commands.experiment import experiment_document
    from qkinspect.cli.commands.heads import heads_document
    from qkinspect.cli.commands.sweep import sweep_document
    from tests.experiment.test_saved_experiment import full_result

    analysis = qkinspect.analyze(minilm, layers=[0, 1], metrics=["symmetry"])
    composition = qkinspect.composition(minilm, layers="0-1", kinds="k")
    directions = qkinspect.directions(minilm, layers="0", heads="0-1", top_directions=1, top_tokens=3)
    experiment = full_result()
    sweep = _sweep_folder(tmp_path)
    analysis.save(tmp_path / "run.json")
    atlas = qkinspect.atlas([str(tmp_path / "run.json")], out=tmp_path / "atlas")
    heads = qkinspect.heads(minilm, sequences=6, length=12, windows=3, window=24, batch=4, resamples=100,
                            permutations=100)
    return [("analysis", analysis, analysis_document(analysis)),
            ("composition", composition, composition_document(composition)),
            ("directions", directions, directions_document(directions)),
            ("experiment", experiment, experiment_document(experiment)),
            ("sweep", sweep, sweep_document(sweep)),
            ("atlas", atlas, atlas_document(atlas)),
            ("heads", heads, heads_document(heads))]


def test_every_result_is_a_table_a_frame_and_saves_what_o_writes(minilm, tmp_path):
    pd = pytest.importorskip("pandas")
    for name, result, doc in _results(minilm, tmp_path):
        fragment = result._repr_html_()
        assert "<table" in fragment or "<pre" in fragment, name
        assert len(text_of(fragment).split()) > 10, name  # a table with something in it
        df = result.to_pandas()
        assert isinstance(df, pd.DataFrame) and len(df) > 0, name
        no_parquet = ("analysis", "experiment", "heads")  # their commands write no Parquet
        assert_saves_what_o_writes(result, doc, tmp_path / name, parquet=name not in no_parquet,
                                   parquet_columns=name == "composition")


def assert_saves_what_o_writes(result, doc, folder, *, parquet: bool, parquet_columns: bool = False,
                               save=None) -> None:
    """`save(path)` (default `result.save`) writes what the command's `-o path` writes, byte for byte, for every
    extension -o knows (`.parquet` where the command writes Parquet: the same table); any other extension is
    refused with an InputError naming the path, and nothing is written."""
    from qkinspect.cli.output import emit, write_parquet
    from qkinspect.errors import InputError

    save = save or result.save
    folder.mkdir(parents=True, exist_ok=True)
    for ext, fmt in ((".json", "json"), (".csv", "csv"), (".ndjson", "ndjson"), (".jsonl", "ndjson"),
                     (".txt", "table")):
        mine = save(folder / f"saved{ext}")
        assert mine == folder / f"saved{ext}"
        emit(doc, fmt, folder / f"o{ext}")  # what the command's -o FILE writes
        assert mine.read_bytes() == (folder / f"o{ext}").read_bytes(), (folder.name, ext)
    assert (folder / "saved.csv").read_text().splitlines()[0].split(",")[0] != "{"  # not JSON under a csv name
    refused = [".xlsx", ""] + ([] if parquet else [".parquet"])
    for ext in refused:
        with pytest.raises(InputError, match=re.escape(str(folder / f"bad{ext}"))):
            save(folder / f"bad{ext}")
        assert not (folder / f"bad{ext}").exists()
    if parquet and pytest.importorskip("pyarrow"):
        import pyarrow.parquet as pq

        save(folder / "saved.parquet")
        write_parquet(result.columns() if parquet_columns else doc.rows, folder / "o.parquet")
        assert pq.read_table(folder / "saved.parquet").equals(pq.read_table(folder / "o.parquet")), folder.name


def test_directions_and_composition_show_their_command_tables(minilm):
    d = qkinspect.directions(minilm, layers="0", heads="0", top_directions=1, top_tokens=3)
    shown = text_of(d._repr_html_())
    assert "layer 0 head 0" in shown and "OV write" in shown and "QK query" in shown
    assert all(t in shown for r in d.records[:2] for t in r.tokens if t and t.isalpha())
    assert len(d.to_pandas()) == len(d.records)
    c = qkinspect.composition(minilm, layers="0-1", kinds="k")
    shown = text_of(c._repr_html_())
    assert "K-composition" in shown and "L0 H" in shown
    assert len(c.to_pandas()) == len(list(c.rows()))
