"""Composition by key/value head (issue 39): under grouped-query attention a later key/value head with its query heads
stacked side by side, against a dense float64 reference of that stacked form, in the library, the records, the CLI
and a saved document read back."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers as tf

import qkinspect
from qkinspect.composition.saved import read_composition
from tests.metrics.composition_reference import llama_like


@pytest.fixture(scope="module")
def gqa(tmp_path_factory):
    """3 layers of 6 query heads on 2 key/value heads (3 query heads a group)."""
    torch.manual_seed(4)
    cfg = tf.LlamaConfig(vocab_size=40, hidden_size=48, intermediate_size=48, num_hidden_layers=3,
                         num_attention_heads=6, num_key_value_heads=2, head_dim=8, max_position_embeddings=16)
    model = tf.LlamaModel(cfg).eval()
    path = tmp_path_factory.mktemp("gqa")
    model.save_pretrained(path)
    return path, model


def dense_stacked(model, a_layer: int, a: int, b_layer: int, group: list[int], kind: str) -> float:
    """‖W_OV^a [X^b]_b‖_F / (‖W_OV^a‖_F ‖[X^b]_b‖_F), X^b the later head's W_QK (q), W_QKᵀ (k) or W_OV (v)."""
    heads = lambda i: llama_like(model.layers[i], 6, 2, fold=True)  # noqa: E731
    Q, K, V, O = heads(a_layer)[a]
    ov = V @ O
    xs = []
    for b in group:
        Qb, Kb, Vb, Ob = heads(b_layer)[b]
        xs.append({"q": Qb @ Kb.T, "k": (Qb @ Kb.T).T, "v": Vb @ Ob}[kind])
    X = np.concatenate(xs, axis=1)  # (D, len(group) D): the group's query heads side by side
    return float(np.linalg.norm(ov @ X) / (np.linalg.norm(ov) * np.linalg.norm(X)))


def test_a_key_value_head_scores_its_stacked_query_heads(gqa):
    path, model = gqa
    r = qkinspect.composition(str(path), by="kv-head", precision="float64")
    assert r.processing.by == "kv-head"
    for kind in ("q", "k", "v"):
        s = r.scores[("decoder", 0, "decoder", 2, kind)]
        assert s.shape == (6, 2)
        for a in (0, 4):
            for g in (0, 1):
                assert s[a, g] == pytest.approx(dense_stacked(model, 0, a, 2, [3 * g, 3 * g + 1, 3 * g + 2], kind),
                                                rel=1e-9)
    top = r.top("k", 3)
    assert all(t.to_heads == tuple(range(3 * t.to_head, 3 * t.to_head + 3)) for t in top)


def test_a_selection_of_query_heads_groups_only_those(gqa):
    path, model = gqa
    r = qkinspect.composition(str(path), by="kv-head", to_heads="1,2,3", kinds="k", precision="float64")
    rows = list(r.rows())
    assert {(x["to_kv_head"], tuple(x["to_heads"])) for x in rows} == {(0, (1, 2)), (1, (3,))}
    x = next(x for x in rows if x["from_layer"] == 0 and x["to_layer"] == 1 and x["from_head"] == 5
             and x["to_kv_head"] == 0)
    assert x["score"] == pytest.approx(dense_stacked(model, 0, 5, 1, [1, 2], "k"), rel=1e-9)


def test_multi_head_attention_by_kv_head_is_by_head():
    r = qkinspect.composition(None, kinds="k", to_layers="1-2")  # the demo model: a key head per query head
    g = r.by_kv_head()
    for key, s in r.scores.items():
        np.testing.assert_allclose(g.scores[key], s, rtol=1e-12)


def test_saved_and_read_back_and_the_cli_says_it(gqa, tmp_path):
    from typer.testing import CliRunner

    from qkinspect.cli.app import app

    path, _ = gqa
    out = tmp_path / "c.json"
    run = CliRunner().invoke
    r = run(app, ["composition", str(path), "--by", "kv-head", "-o", str(out)])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(out.read_text())
    from tests.cli.schema import validate

    validate(doc)
    assert doc["processing"]["by"] == "kv-head" and "to_kv_head" in doc["records"][0]
    back = read_composition(out)
    lib = qkinspect.composition(str(path), by="kv-head")
    for key, s in lib.scores.items():
        np.testing.assert_allclose(back.scores[key], s, rtol=1e-12)
    # a saved by-head document regroups by key/value head (its later heads' norms are kept)
    by_head = tmp_path / "h.json"
    assert run(app, ["composition", str(path), "-o", str(by_head)]).exit_code == 0
    regrouped = read_composition(by_head).by_kv_head()
    for key, s in lib.scores.items():
        np.testing.assert_allclose(regrouped.scores[key], s, rtol=1e-6)
    table = run(app, ["composition", str(path), "--by", "kv-head", "--kinds", "k", "-f", "table"],
                env={"COLUMNS": "80"})
    assert table.exit_code == 0, table.stderr
    assert "KV0 (H0-2)" in table.stdout or "KV1 (H3-5)" in table.stdout
    assert "by key/value head" in table.stdout
    plain = run(app, ["composition", str(path), "--kinds", "k", "-f", "table"], env={"COLUMNS": "80"})
    assert "--by kv-head" in plain.stdout


def test_by_is_checked():
    from qkinspect.errors import InputError

    with pytest.raises(InputError, match="^by='kv': choose head or kv-head$"):
        qkinspect.composition(None, by="kv")


def test_the_figure_and_report_table_draw_key_value_heads(gqa):
    from qkinspect.report.composition.figures import composition_figure, head_grid, top_table
    from qkinspect.report.style import style

    path, _ = gqa
    r = qkinspect.composition(str(path), by="kv-head")
    grid, rows, cols = head_grid(r, "k")
    assert grid.shape == (2 * 6, 2 * 2) and cols == [0, 2]  # earlier layers 0-1 by query head, later by kv head
    with style():
        composition_figure(r)
    t = top_table(r, "k", 3)
    assert t.header[1] == "later key/value head b" and all(" kv " in row[1] and "(3 q)" in row[1] for row in t.rows)
