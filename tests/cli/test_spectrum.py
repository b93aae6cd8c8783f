"""`qkinspect spectrum`: one head's singular values (and eigenvalues for qk and ov), checked against dense math."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
import torch

from qkinspect.loading import open_model
from tests.cli.schema import validate


def _head(path, layer: int, head: int):
    with open_model(path) as m:
        (L,) = m.layers(layers=[layer])
    g = head // L.spec.group_size
    return (L.W_Q[head].double(), L.W_K[g].double(), L.W_V[g].double(), L.W_O[head].double())


DENSE = {
    "qk": lambda Q, K, V, O: Q @ K.T,
    "q": lambda Q, K, V, O: Q,
    "k": lambda Q, K, V, O: K,
    "v": lambda Q, K, V, O: V,
    "ov": lambda Q, K, V, O: V @ O,
}


@pytest.mark.parametrize("matrix", list(DENSE))
def test_singular_values_match_dense(cli, tiny_bert, matrix):
    r = cli("spectrum", tiny_bert, "--layer", "1", "--head", "2", "--matrix", matrix, "-f", "json")
    assert r.exit_code == 0, r.stderr
    d = validate(json.loads(r.stdout))
    assert (d["kind"], d["layer"], d["head"], d["matrix"]) == ("spectrum", 1, 2, matrix)
    M = DENSE[matrix](*_head(tiny_bert, 1, 2))
    sv = torch.linalg.svdvals(M).numpy()[:8]  # rank <= d_head = 8
    assert np.allclose(d["singular_values"], sv, rtol=1e-4, atol=1e-5)
    if matrix in ("qk", "ov"):
        got = np.array([complex(re, im) for re, im in d["eigenvalues"]])
        ev = np.linalg.eigvals(M.numpy())
        ev = ev[np.argsort(-np.abs(ev))][:8]
        assert np.allclose(np.sort_complex(got), np.sort_complex(ev), atol=1e-4)
    else:
        assert d["eigenvalues"] is None


def test_csv_one_row_per_index(cli, tiny_bert):
    r = cli("spectrum", tiny_bert, "--layer", "0", "--head", "0", "-f", "csv")
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert list(rows[0]) == ["index", "singular_value", "eig_real", "eig_imag", "eig_abs"]
    assert [int(x["index"]) for x in rows] == list(range(8))
    sv = [float(x["singular_value"]) for x in rows]
    assert sv == sorted(sv, reverse=True)


def test_table_on_demo(cli):
    r = cli("spectrum", "--layer", "2", "--head", "3", "-f", "table")
    assert r.exit_code == 0, r.stderr
    assert "encoder layer 2 head 3 (KV head 3): W_Q W_Kᵀ" in r.stdout and "singular value" in r.stdout
    assert len([line for line in r.stdout.splitlines() if "█" in line]) == 32  # d_head rows


def test_out_of_range_head(cli, tiny_bert):
    r = cli("spectrum", tiny_bert, "--layer", "0", "--head", "4")
    assert r.exit_code == 2 and r.stdout == "" and "--head: 4 is out of range" in r.stderr
