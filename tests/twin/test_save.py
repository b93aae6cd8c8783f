"""`Twin.save(path)` writes what `qkinspect twin -o path` writes, in the format the extension names (issue 44:
`runs.csv` and `.parquet` were JSON under those names); an extension -o does not know is refused."""

from __future__ import annotations

import pytest

import qkinspect
from qkinspect.cli.output import Document
from qkinspect.errors import InputError
from tests.test_notebook import assert_saves_what_o_writes
from tests.twin.conftest import TINY


@pytest.fixture(scope="module")
def twin(tmp_path_factory, small_text):
    return qkinspect.twin(tmp_path_factory.mktemp("twin"), text=small_text, variants="share_qk", seeds=1, steps=2,
                          **TINY)


@pytest.mark.parametrize("rows", ["runs", "summary"])
def test_twin_saves_what_o_writes_in_every_format(twin, tmp_path, rows):
    doc = Document(json=twin.document(), rows=twin.rows(rows), render=twin.render_table)  # as `twin -o` builds it
    assert_saves_what_o_writes(twin, doc, tmp_path, parquet=True, save=lambda p: twin.save(p, rows=rows))


def test_twin_save_refuses_an_unknown_row_kind_before_writing(twin, tmp_path):
    with pytest.raises(InputError, match="kind='bogus'"):
        twin.save(tmp_path / "x.csv", rows="bogus")
    assert not (tmp_path / "x.csv").exists()
