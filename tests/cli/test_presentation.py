"""Sorting, trimming, tables and differences, on hand-built results with known numbers."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from qkinspect.analysis.compare import check_same_shapes, head_deltas
from qkinspect.cli.run import sort_and_trim
from qkinspect.errors import InputError
from qkinspect.terminal.analysis import baseline_lines, default_columns, render_analysis
from qkinspect.terminal.tables import scale_style
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


def test_scale_style_steps_follow_the_value_in_16_colours():
    assert scale_style("symmetry", 0.9) == "bold red" and scale_style("symmetry", 0.2) == "red"
    assert scale_style("symmetry", -0.9) == "bold blue" and scale_style("symmetry", -0.2) == "blue"
    assert scale_style("symmetry", 0.05) == ""
    assert [scale_style("overlap_qk", x) for x in (0.1, 0.3, 0.5, 0.9)] == ["dim", "", "green", "bold green"]
    assert scale_style("delta_symmetry", 0.5) == "bold red"
    assert scale_style("symmetry", NAN) == "dim"
    assert scale_style("qk_effective_rank", 3.0) == ""
    # only the 16 standard colours (and bold/dim): no hue is left to a 16-colour terminal's nearest match
    from rich.style import Style

    for metric in ("symmetry", "overlap_qk"):
        for x in (-1, -0.5, -0.2, 0, 0.2, 0.5, 0.8, 1):
            color = Style.parse(scale_style(metric, x) or "none").color
            assert color is None or color.number is not None and color.number < 8


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
    for s in ("m (bert) encoder: 2 layers x 2 heads", "0.900", "-0.400", "0.450", "per layer", "sym_med",
              "random baseline (encoder, 64 Gaussian heads): sym 0.001±0.002", "sym=symmetry",
              "sym_med=symmetry_median"):
        assert s in text, s
    header = next(line for line in text.splitlines() if line.startswith("layer"))
    assert header.split() == ["layer", "head", "sym", "ovl_qk"]  # no block (one), no kv (= head)
    assert baseline_lines([]) == []


@pytest.mark.parametrize("width", [40, 60, 80, 120])
def test_tables_fold_instead_of_cutting(width):
    """Every number is printed whole at any width: columns that do not fit go to a second table."""
    from qkinspect.analysis.results import HeadRecord
    from qkinspect.terminal.analysis import DEFAULT_COLUMNS

    r = result(SYM)
    values = {m: -123.456 + i for i, m in enumerate(DEFAULT_COLUMNS)}
    r.heads = [HeadRecord("encoder", h.layer, h.head, 1 - h.head, dict(values)) for h in r.heads]
    buf = io.StringIO()
    render_analysis(Console(file=buf, width=width, no_color=True), r, columns=list(DEFAULT_COLUMNS))
    text = buf.getvalue()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= width
    for v in values.values():
        assert f"{v:.3f}" in text
    assert text.count("continued") >= (1 if width <= 80 else 0)
    assert " kv " in text  # kv differs from head here: shown


def test_short_names():
    from qkinspect.terminal.tables import short_name

    assert short_name("delta_symmetry") == "Δsym"
    assert short_name("qk_effective_rank_median") == "erank_med"
    assert short_name("head_overlap") == "head_overlap"  # no short form: kept whole


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
    from qkinspect.analysis.request import CLI_NAMES, check_request

    check_request(names=CLI_NAMES).check_sort("symmetry", 3)
    check_request(["symmetry"], layer_form=True, names=CLI_NAMES).check_sort("symmetry_layer", None, by="layer")
    with pytest.raises(InputError, match="^--sort: 'overlap_qk' is not among the head metrics computed: symmetry$"):
        check_request(["symmetry"], names=CLI_NAMES).check_sort("overlap_qk", None)
    with pytest.raises(InputError, match="layer metrics"):
        check_request(names=CLI_NAMES).check_sort("symmetry", None, by="layer")
    with pytest.raises(InputError, match="^--top: 0 must be at least 1$"):
        check_request(names=CLI_NAMES).check_sort(None, 0)
    with pytest.raises(InputError, match="^sort='x' is not among the head metrics"):  # the library's names
        check_request().check_sort("x", None)
