"""The report's plain-words summary: each sentence says what the records hold, and only when they hold it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from qkinspect.report.analysis.summary import summary
from tests.report import synthetic


def _text(result) -> str:
    return " ".join(p for s in summary(result) for p in s.paragraphs)


def test_sharing_sentence_names_the_median_and_the_closest_head():
    r = synthetic.result(synthetic.block(n_layers=2, n_heads=3))
    dist = np.linspace(0.95, 0.45, len(r.heads))  # the last head is the closest to a shared matrix
    heads = tuple(replace(h, values={**h.values, "shared_qk_distance": float(x)})
                  for h, x in zip(r.heads, dist, strict=True))
    text = _text(replace(r, heads=heads))
    last = heads[-1]
    assert "Could queries and keys share one matrix?" in text
    assert f"The median head's W_Q W_Kᵀ lies {np.median(dist):.3f}" in text
    assert f"The closest is layer {last.layer} head {last.head} (0.450)." in text


def test_no_sharing_sentence_without_the_metric():
    assert "share one matrix?" not in _text(synthetic.result())


def _with_ranks(d_head: int, eff, stable, k90):
    """A one-block result whose heads hold the chosen rank values (one list entry per head)."""
    r = synthetic.result(synthetic.block(n_layers=1, n_heads=len(eff), d_model=4 * d_head, d_head=d_head))
    heads = [replace(h, values={**h.values, "qk_effective_rank": float(e), "qk_stable_rank": float(s),
                                "qk_k90": float(k)})
             for h, e, s, k in zip(r.heads, eff, stable, k90, strict=True)]
    return replace(r, heads=heads)


def _rank_text(result) -> str:
    (p,) = [p for s in summary(result) for p in s.paragraphs if p.startswith("How low-rank.")]
    return p


def test_the_rank_verdict_reads_every_number_it_shows():
    """Gemma-3's case: a high effective rank beside a stable rank of 6.5 of 256 is not "close to full rank", and
    the median of two whole k90 counts is written as the two counts, not as 65.500."""
    text = _rank_text(_with_ranks(256, [150, 151], [6.4, 6.6], [65, 66]))
    assert "close to full rank" not in text.replace("not close to full rank", "")
    assert "not close to full rank" in text and "a few directions dominate" in text
    assert "stable rank 6.500 (3% of d_head)" in text and "65–66 dimensions (26% of d_head)" in text
    assert "65.500" not in text and "effective rank 150.500 (59% of d_head)" in text


@pytest.mark.parametrize("eff, stable, k90, verdict", [
    ([200, 220], [150, 160], [180, 190], "close to full rank: every measure"),
    ([20, 22], [5, 6], [30, 31], "strongly low-rank"),
    ([100, 110], [70, 80], [150, 160], "moderately low-rank: its effective rank and stable rank are below half"),
    ([200, 220], [10, 12], [180, 190], "a few directions dominate"),
    ([200, 220], [150, 160], [40, 42], "a few directions dominate"),
])
def test_the_rank_verdict_follows_the_numbers(eff, stable, k90, verdict):
    text = _rank_text(_with_ranks(256, eff, stable, k90))
    assert verdict in text
    said = text.split(" So ", 1)[1]  # the verdict, after the numbers
    least = min(np.median(stable), np.median(k90), np.median(eff))
    assert ("close to full rank" in said.replace("not close to full rank", "")) == (least >= 128)  # half of d_head
    if least < 64:  # a measure below a quarter of d_head: the verdict says the form is low-rank or dominated
        assert "strongly low-rank" in said or "a few directions dominate" in said


def test_whole_counts_in_the_tables():
    from qkinspect.report.analysis.tables import layer_tables

    r = _with_ranks(256, [150, 151], [6.4, 6.6], [65, 66])
    cells = [c for t in layer_tables(r) for i, h in enumerate(t.header) if h == "qk_k90" for c in
             (row[i] for row in t.rows)]
    assert cells == ["65–66"]


def _qk_norm(result, folded: bool):
    blocks = tuple(replace(b, qk_norm=True) for b in result.model.blocks)
    return replace(result, model=replace(result.model, blocks=blocks),
                   processing=replace(result.processing, fold_qk_norm=folded))


def test_raw_q_k_norm_forms_are_said_not_to_be_what_attention_computes():
    from qkinspect.report.analysis.summary import qk_norm_notice

    plain = synthetic.result(synthetic.block(n_layers=1, n_heads=2))
    assert qk_norm_notice(plain) == "" and "Not what attention computes" not in _text(plain)
    raw = _qk_norm(plain, folded=False)
    text = _text(raw)
    assert "Not what attention computes. The encoder block normalises queries and keys" in text
    assert "--fold-qk-norm" in text and "without the q/k-norm gains" in text
    folded = _qk_norm(plain, folded=True)
    assert qk_norm_notice(folded) == "" and "with q/k-norm gains folded" in _text(folded)


def test_the_report_cover_and_summary_carry_the_q_k_norm_notice(tmp_path):
    from pypdf import PdfReader

    from qkinspect.report.analysis.pdf import write_pdf

    out = tmp_path / "r.pdf"
    write_pdf(_qk_norm(synthetic.result(synthetic.block(n_layers=1, n_heads=2)), folded=False), out)
    pages = [" ".join(p.extract_text().split()) for p in PdfReader(out).pages]
    assert "Not what attention computes" in pages[0] and "Not what attention computes" in pages[1]
    assert "--fold-qk-norm" in pages[0]
