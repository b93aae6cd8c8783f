"""`qkinspect report`: a multi-page PDF whose extracted text (pypdf) holds the model's name, the metric names and
the numbers `qkinspect analyze` reports for the same model, rounded as the CLI rounds them."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from pypdf import PdfReader

from qkinspect.report.analysis.pdf import plan_figures, write_pdf
from qkinspect.report.analysis.text import CAPTIONS
from qkinspect.report.style import fmt

FRONT_PAGES = 3  # cover, summary, definitions (each at least one page)


def _analyze_json(cli, model) -> dict:
    r = cli("analyze", model, "-m", "default,head_overlap", "-f", "json")
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def _report(cli, model, tmp_path) -> tuple[list[str], int]:
    out = tmp_path / "report.pdf"
    r = cli("report", model, "-o", out)
    assert r.exit_code == 0, r.stderr
    n = int(re.search(r"wrote an? (\d+)-page report", r.stderr).group(1))
    return [p.extract_text() for p in PdfReader(out).pages], n


@pytest.mark.parametrize("model", ["llama", pytest.param("bart", marks=pytest.mark.slow)])
def test_report_holds_what_analyze_reports(cli, llama_path, bart_path, tmp_path, model):
    path = {"llama": llama_path, "bart": bart_path}[model]
    doc = _analyze_json(cli, path)
    pages, n = _report(cli, path, tmp_path)
    text = "\n".join(pages)
    assert len(pages) == n >= FRONT_PAGES + len(plan_figures_for(doc))
    assert doc["model"]["name"] in pages[0] and "qkinspect report" in pages[0]
    for name in ("symmetry", "directionality", "qk_effective_rank", "qk_stable_rank", "qk_k90", "overlap_qk",
                 "overlap_qv", "overlap_kv"):
        assert name in text, name
    # defined only when shown: CKA is computed by the default analysis but drawn and tabulated nowhere
    assert "cka_qk" in doc["heads"][0] and "cka_qk" not in text
    for layer in doc["layers"]:
        for metric in ("symmetry_median", "symmetry_mean", "qk_effective_rank_median"):
            assert fmt(layer[metric]) in text, (layer["block"], layer["layer"], metric)
    for base in doc["baselines"]:
        if base["metric"] in ("symmetry", "overlap_qk"):
            assert f"{fmt(base['mean'])} ± {fmt(base['std'])}" in text, base
    for block in {h["block"] for h in doc["heads"]}:
        sym = [h["symmetry"] for h in doc["heads"] if h["block"] == block]
        assert f"median symmetry score of W_Q W_Kᵀ is {fmt(np.median(sym))}" in text.replace("\n", " "), block
        assert f"{block}: {len(sym)} heads" in text


def plan_figures_for(doc: dict) -> list[str]:
    blocks = {h["block"] for h in doc["heads"]}
    return ["symmetry", "distribution", "overlap", "rank", "spectra", *(["heads"] * len(blocks))]


@pytest.mark.slow
def test_figure_pages_carry_captions(results, tmp_path):
    r = results["bart"]
    n = write_pdf(r, tmp_path / "r.pdf")
    pages = [p.extract_text() for p in PdfReader(tmp_path / "r.pdf").pages]
    assert len(pages) == n
    plans = plan_figures(r)
    assert [p.block for p in plans if p.kind == "heads"] == ["encoder", "decoder", "cross"]
    for kind, caption in CAPTIONS.items():
        first_words = " ".join(caption.split()[:4])
        hits = [i for i, t in enumerate(pages) if first_words in t.replace("\n", " ")]
        assert hits, kind
        assert r.model.name in pages[hits[0]]  # the figure's title on the same page


def test_report_text_is_searchable_for_the_demo(results, tmp_path):
    r = results["demo"]
    n = write_pdf(r, tmp_path / "demo.pdf")
    text = "\n".join(p.extract_text() for p in PdfReader(tmp_path / "demo.pdf").pages)
    assert n >= FRONT_PAGES + 6
    assert "all-MiniLM-L6-v2" in text and "Definitions" in text and "Per-layer tables" in text
    assert f"qkinspect {__import__('qkinspect').__version__}" in text
    flat = text.replace("\n", " ")
    # the registry's gauge field in words: basis-dependent metrics are not passed off as invariant
    assert "gauge-invariant (describes the model)" in flat
    from qkinspect.metrics.registry import METRICS
    from qkinspect.report.analysis.tables import shown_metrics

    shown = shown_metrics(r)
    assert "symmetry" in shown and "cka_qk" not in shown  # the report defines what it shows
    orthogonal = any(METRICS[m].gauge_invariant == "orthogonal" for m in shown)
    assert ("invariant under orthogonal re-basings only" in flat) == orthogonal


@pytest.mark.parametrize("args, message", [
    (["-o", "report.html"], "report writes PDF"),
    ([], "give -o FILE.pdf"),
])
def test_report_refuses(cli, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    r = cli("report", *args)
    assert r.exit_code == 2 and message in r.stderr
    assert not list(tmp_path.iterdir())


def test_html_report_holds_the_same(cli, llama_path, tmp_path):
    out = tmp_path / "report.html"
    r = cli("report", llama_path, "--html", "-o", out)
    assert r.exit_code == 0, r.stderr
    page = out.read_text()
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    doc = _analyze_json(cli, llama_path)
    assert doc["model"]["name"] in page
    assert page.count("<svg") == len(plan_figures_for(doc))  # every figure inline, nothing fetched from elsewhere
    for layer in doc["layers"]:
        assert fmt(layer["symmetry_median"]) in page
    sym = [h["symmetry"] for h in doc["heads"]]
    assert f"median symmetry score of W_Q W_Kᵀ is {fmt(np.median(sym))}" in page
    r = cli("report", llama_path, "--html", "-o", tmp_path / "x.pdf")
    assert r.exit_code == 2 and "report writes HTML" in r.stderr


def test_the_article_goes_by_how_the_page_count_is_said():
    from qkinspect.cli.commands.report import pages

    said = {1: "a", 5: "a", 8: "an", 11: "an", 18: "an", 80: "an", 110: "a", 118: "a", 800: "an", 1100: "a",
            8000: "an", 11000: "an", 18000: "an", 110000: "a"}
    assert {n: pages(n).split()[0] for n in said} == said
    assert pages(12) == "a 12-page"
