"""An experiment result in a notebook: its terminal table as HTML with a row per run, and `to_pandas()` with a row
per run and the columns of `experiment --format csv`."""

from __future__ import annotations

import pytest

from qkinspect.experiment.results import run_rows
from qkinspect.experiment.run import run_experiment
from tests.experiment import tiny_models
from tests.test_notebook import rows_of, text_of


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    folder = tiny_models.llama(tmp_path_factory.mktemp("nb") / "llama")
    return run_experiment(str(folder), "share_qk", layers=[1], heads=[0, 1], tokens=96, window=32)


def test_the_result_shows_its_table_with_every_run(result):
    fragment = result._repr_html_()
    rows = rows_of(fragment)
    assert len(result.runs) == 4  # 2 heads x (share_qk, ablate)
    for r in result.runs:
        want = [r.edit, r.scope, str(r.layer), str(r.head), f"{r.loss:.4f}", f"{r.dloss:+.4f}"]
        assert any(row[:6] == want for row in rows), want
    assert "baseline" in text_of(fragment) and "<span style=" in fragment


def test_to_pandas_is_a_row_per_run_with_the_csv_columns(result):
    pytest.importorskip("pandas")
    df = result.to_pandas()
    assert len(df) == len(result.runs)
    assert list(df.columns) == list(run_rows(result)[0])  # model, measure, edit, scope, layer, head, ..., seconds
    assert df["dloss"].tolist() == [r.dloss for r in result.runs]
