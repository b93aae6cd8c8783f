"""The model report says what each page shows in words a reader can take: no Python values on the cover, no empty
rows, table headers with whole words, and the q/k-norm caveat on every figure and caption it concerns."""

from __future__ import annotations

import io

import pytest

import qkinspect
from qkinspect.report.analysis import figures
from qkinspect.report.analysis.text import processing_pairs
from qkinspect.report.pages import TextPages, header_lines, text_width
from qkinspect.report.tables import Table
from tests.cli.test_fold_qk_norm import save_qwen3
from tests.report import synthetic


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return save_qwen3(tmp_path_factory.mktemp("qwen3"), seed=7)


def test_the_cover_lists_processing_in_words():
    """No empty q/k-norm row for a model without q/k norms, no `False`, `None` or tuple reprs, and `dequantized`
    is "no" (it printed "all" for None)."""
    pairs = dict(processing_pairs(synthetic.result()))
    assert "qk_norm_not_folded" not in pairs
    assert pairs["fold_ln"] == "no" and pairs["layers"] == "all" and pairs["dequantized"] == "no"
    assert all(v and not v.startswith(("(", "[")) and v not in ("True", "False", "None") for v in pairs.values())


def test_a_header_keeps_its_words_whole():
    """Eight columns of a layer table: "directionality" was broken as "directionalit / y"."""
    names = ["layer", "directionality median", "qk_participation_ratio median", "symmetry median", "qk k90 median",
             "overlap qv median", "overlap kv median", "shared_qk_distance median"]
    t = Table("encoder: per-layer values", names, [[str(i)] + ["0.123"] * 7 for i in range(3)])
    pages = TextPages(lambda fig: None)
    pages.table(t)
    lines, size = header_lines(names, (pages.width - 0.7) / 7 - 0.1, 7.5)
    words = {w for n in names for w in n.replace("_", " ").split()}
    assert all(w in words for col in lines for line in col for w in line.split())  # no piece of a word
    assert 6.0 <= size < 7.5 and text_width("directionality", size, bold=True) <= (pages.width - 0.7) / 7 - 0.1


def test_the_q_k_norm_caveat_is_on_the_figures_and_captions_it_concerns(qwen3):
    """A model with q/k norms measured raw: the figures of W_Q W_Kᵀ (symmetry, ranks, spectra, a metric of W_Q or
    W_K) say so in the figure's title and in the report's captions; the overlap of column spaces, which the gains leave
    as they are, does not; folded, none does."""
    from pypdf import PdfReader

    from qkinspect.report.analysis.pdf import plan_figures, write_pdf

    raw = qkinspect.analyze(str(qwen3), metrics=["default", "head_overlap"])
    caveat = "q/k-norm gains not folded in"
    for kind in ("symmetry", "distribution", "rank", "spectra"):
        assert caveat in " ".join(figures.figure(raw, kind).get_suptitle().split()), kind
    assert caveat in " ".join(figures.figure(raw, "metric", metric_name="qk_stable_rank").get_suptitle().split())
    for kind in ("overlap", "heads"):
        assert caveat not in figures.figure(raw, kind).get_suptitle()
    plans = {p.kind: p.caption for p in plan_figures(raw)}
    assert all((caveat in c) == (k not in ("overlap", "heads")) for k, c in plans.items())
    buf = io.BytesIO()
    write_pdf(raw, buf)
    text = " ".join(" ".join(p.extract_text().split()) for p in PdfReader(buf).pages)
    assert text.count(caveat) >= 2 * 4  # under each of 4 figures and in its caption
    folded = qkinspect.analyze(str(qwen3), metrics=["default", "head_overlap"], fold_qk_norm=True)
    assert all(caveat not in p.caption for p in plan_figures(folded))
    assert caveat not in figures.figure(folded, "symmetry").get_suptitle()
    assert dict(processing_pairs(raw))["qk_norm_not_folded"] == "decoder"


def test_a_table_column_never_runs_into_the_next():
    """The composition pages ran two columns together ("layer 16 head 6layer 19 head 0" where the text is read
    or copied): the first column is as wide as its widest cell, so each row's cells stand apart on the page."""
    pypdf = pytest.importorskip("pypdf")
    from matplotlib.backends.backend_pdf import PdfPages

    rows = [[f"layer {16 + i} head {6 + i}", f"layer {19 + i} head {i}", "0.123", "4.56"] for i in range(4)]
    buf = io.BytesIO()
    with PdfPages(buf) as pdf:
        pages = TextPages(pdf.savefig)
        pages.table(Table("Q-composition: the 4 strongest pairs", ["earlier head a", "later head b", "score",
                                                                   "score / null"], rows))
        pages.close()
    text = pypdf.PdfReader(io.BytesIO(buf.getvalue())).pages[0].extract_text()
    for row in rows:
        assert " ".join(row) in text, text
