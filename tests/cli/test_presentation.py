"""Sorting, trimming, tables and differences, on hand-built results with known numbers."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from qkinspect.cli.commands.compare import check_same_shapes, head_deltas
from qkinspect.cli.run import sort_and_trim
from qkinspect.cli.tables import baseline_lines, default_columns, render_analysis, scale_style
from qkinspect.errors import InputError
from tests.cli.fake import NAN, info, result

SYM = {(0, 0): 0.2, (0, 1): NAN, (1, 0): 0.9, (1, 1): -0.4}


def test_sort_descending_nan_last_and_top():
    r = sort_and_trim(result(SYM), sort="symmetry", top=None)
    assert [(h.layer, h.head) for h in r.heads] == [(1, 0), (0, 0), (1, 1), (0, 1)]
    r = sort_and_trim(result(SYM), sort="symmetry", top=2, ascending=True)
    assert [h.values["symmetry"] for h in r.heads] == [-0.4, 0.2]


def test_top_without_sort_keeps_file_order():
    assert [(h.layer, h.head) for h in sort_and_trim(result(SYM), sort=None, top=3).heads] == [(0, 0), (0, 1), (1, 0)]


@pytest.mark.parametrize("kw, message", [
    ({"sort": "nope", "top": None}, "not among the head metrics computed: overlap_qk, symmetry"),
    ({"sort": None, "top": 0}, "--top"),
])
def test_sort_and_top_refuse(kw, message):
    with pytest.raises(InputError, match=message):
        sort_and_trim(result(SYM), **kw)


def test_scale_style():
    assert scale_style("symmetry", 0.9).startswith("rgb(240")  # strongly positive: red
    assert scale_style("symmetry", -0.9).endswith(",240)")  # strongly negative: blue
    assert scale_style("overlap_qk", 1.0) == "rgb(80,255,100)"
    assert scale_style("symmetry", NAN) == "dim"
    assert scale_style("qk_effective_rank", 3.0) == ""


def test_default_columns():
    r = result(SYM)
    assert default_columns(r) == ["symmetry", "overlap_qk"]
    assert default_columns(r, ("overlap_qk",)) == ["overlap_qk"]
    assert default_columns(r, ("overlap_qk",), sort="symmetry") == ["overlap_qk", "symmetry"]
    assert default_columns(r, ("overlap",)) == ["overlap_qk"]  # a group stands for its computed head metrics


def test_render_analysis_text():
    buf = io.StringIO()
    render_analysis(Console(file=buf, width=120, no_color=True), result(SYM), columns=["symmetry", "overlap_qk"])
    text = buf.getvalue()
    for s in ("m (bert) encoder: 2 layers x 2 heads", "0.900", "-0.400", "0.450", "per layer", "symmetry_median",
              "random baseline (encoder, 64 Gaussian heads): symmetry 0.001 ± 0.002"):
        assert s in text, s
    assert baseline_lines([]) == []


def test_head_deltas_b_minus_a():
    rows = head_deltas(result(SYM), result({k: 0.5 for k in SYM}))
    by = {(r["layer"], r["head"]): r for r in rows}
    assert by[(1, 0)]["delta_symmetry"] == pytest.approx(0.5 - 0.9)
    assert by[(1, 1)]["delta_overlap_qk"] == pytest.approx(0.25 + 0.2)
    assert by[(0, 1)]["symmetry_a"] != by[(0, 1)]["symmetry_a"]  # NaN in A stays NaN in the difference
    assert by[(0, 1)]["delta_symmetry"] != by[(0, 1)]["delta_symmetry"]
    assert len(rows) == 4


def test_check_same_shapes():
    check_same_shapes(info("a"), info("b"))
    msg = r"shapes differ \(encoder n_heads 2 vs 4; encoder n_kv_heads 2 vs 4; encoder d_model 8 vs 16\)"
    with pytest.raises(InputError, match=msg):
        check_same_shapes(info("a"), info("b", n_heads=4, d_model=16))


def test_check_sort_before_the_analysis():
    from qkinspect.cli.run import check_sort

    check_sort("symmetry", 3, metrics=None)
    check_sort("symmetry_layer", None, metrics=("symmetry",), by="layer", layer_form=True)
    with pytest.raises(InputError, match="not among the head metrics computed: symmetry$"):
        check_sort("overlap_qk", None, metrics=("symmetry",))
    with pytest.raises(InputError, match="layer metrics"):
        check_sort("symmetry", None, metrics=None, by="layer")
    with pytest.raises(InputError, match="--top"):
        check_sort(None, 0, metrics=None)
