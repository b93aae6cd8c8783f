"""The experiment figure: cell numbers only where they fit (never two overprinting one another), every edit run
drawn whatever its scope, and the model's name in the title; on its own and on the report's page."""

from __future__ import annotations

import io

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from qkinspect.experiment.saved import check_experiment
from qkinspect.report.experiment.figure import experiment_figure
from qkinspect.report.heatmap import CellNumbers
from qkinspect.report.style import PAGE, style
from tests.report.inside import texts_outside

EDITS = ("share_qk", "tie_k", "symmetric", "share_qkv", "ablate")


def runs_doc(scope: str, layers: int = 6, heads: int = 9, ranks=(4, 8), se: bool = True) -> dict:
    rng = np.random.default_rng(0)
    units = {"head": [(i, h) for i in range(layers) for h in range(heads)],
             "layer": [(i, None) for i in range(layers)], "model": [(None, None)]}[scope]
    runs = [{"edit": e, "scope": scope, "layer": i, "head": h, "dloss": float(rng.gamma(1.0, 0.02)),
             **({"dloss_se": 0.002} if se else {}), "predicted": float(rng.uniform()) if scope == "head" else None}
            for e in (*EDITS, *(f"rank:{k}" for k in ranks)) for i, h in units]
    return {"kind": "experiment", "model": {"name": "/models/SmolLM2-135M.Q8_0.gguf"}, "baseline": 2.5,
            "measure": {"name": "next-token cross-entropy"}, "runs": runs}


def drawn(doc: dict):
    """The experiment figure of `doc`, read as `plot` reads it."""
    return experiment_figure(check_experiment(doc, "runs.json"))


def _drawn_numbers(fig, dpi: float | None = None) -> list:
    """Draw the figure (at `dpi`) and return, per heatmap, the cell numbers drawn and the cell size in pixels."""
    root = fig.figure
    if dpi is not None:
        root.set_dpi(dpi)
    FigureCanvasAgg(root)
    with style():
        root.canvas.draw()
    renderer = root.canvas.get_renderer()
    out = []
    for ax in root.get_axes():
        for art in ax.artists:
            if isinstance(art, CellNumbers):
                (x0, y0), (x1, y1) = ax.transData.transform([(0, 0), (1, 1)])
                out.append(([t.get_window_extent(renderer) for t in art.drawn], abs(x1 - x0), abs(y1 - y0)))
    return out


def _overlaps(boxes) -> list[tuple[int, int]]:
    return [(i, j) for i in range(len(boxes)) for j in range(i + 1, len(boxes)) if boxes[i].overlaps(boxes[j])]


@pytest.mark.parametrize("layers, heads, dpi", [(6, 9, 100), (6, 9, 200), (2, 3, 100), (12, 16, 200),
                                                (3, 4, 72)])
def test_cell_numbers_fit_their_cells_and_never_overlap(layers, heads, dpi):
    fig = drawn(runs_doc("head", layers, heads))
    panels = _drawn_numbers(fig, dpi)
    assert len(panels) == len(EDITS) + 2
    for boxes, cell_w, cell_h in panels:
        assert _overlaps(boxes) == []
        assert all(b.width <= cell_w and b.height <= cell_h for b in boxes)


def test_numbers_are_written_where_cells_are_large():
    """Big cells carry their numbers (the test above would pass with none drawn at all)."""
    panels = _drawn_numbers(drawn(runs_doc("head", 2, 3, ranks=())), 100)
    assert all(len(boxes) == 6 for boxes, _, _ in panels)
    small = _drawn_numbers(drawn(runs_doc("head", 12, 16, ranks=())), 100)
    assert all(boxes == [] for boxes, _, _ in small)  # 192 cells per panel: the colour bar carries the scale


def test_the_report_page_draws_no_smudge():
    """On the report's A4 page, in the PDF: the same rule, measured by the PDF renderer."""
    from qkinspect.report.pages import page_canvas

    page = Figure(figsize=PAGE, layout="constrained")
    experiment_figure(check_experiment(runs_doc("head", 6, 9), "runs.json"), canvas=page_canvas(page, {}))
    with style():
        page.savefig(io.BytesIO(), format="pdf")
    for ax in page.get_axes():
        for art in ax.artists:
            if isinstance(art, CellNumbers):
                boxes = [t.get_window_extent() for t in art.drawn]
                assert _overlaps(boxes) == []
    assert texts_outside(page) == []


@pytest.mark.parametrize("scope", ["model", "layer"])
def test_every_edit_run_is_drawn_at_model_and_layer_scope(scope):
    doc = runs_doc(scope)
    fig = drawn(doc)
    assert "SmolLM2-135M.Q8_0.gguf" in fig.get_suptitle().replace("\n", "")
    axes = [ax for ax in fig.get_axes() if ax.get_visible()]
    bars = [ax for ax in axes if ax.get_title() in ("all chosen heads edited at once", "each layer edited alone")]
    assert len(bars) == 1 and "truncating the rank" in [ax.get_title() for ax in axes]
    (ax,) = bars
    want = [r["dloss"] for r in doc["runs"]]
    got = [p.get_height() for p in ax.patches]
    assert sorted(got) == pytest.approx(sorted(want))  # one bar per run, every edit
    names = ([t.get_text() for t in ax.get_xticklabels()] if scope == "model"
             else [t.get_text() for t in ax.get_legend().get_texts()])
    assert names == [*[e for e in EDITS if e != "ablate"], "rank:4", "rank:8", "ablate"]
    assert texts_outside(fig) == []


def test_a_lone_model_run_is_drawn():
    doc = runs_doc("model", ranks=(), se=False)
    doc["runs"] = doc["runs"][:1]
    fig = drawn(doc)
    assert [p.get_height() for ax in fig.get_axes() for p in ax.patches] == [doc["runs"][0]["dloss"]]


def test_every_run_carries_its_standard_error_in_the_figure():
    """Issue 39: each head's Δloss against the prediction has its ± s.e. bar, the rank curve its bars, and the
    heatmaps say the standard error (at 512 tokens it is as large as the head-to-head differences)."""
    from matplotlib.collections import LineCollection

    doc = runs_doc("head")
    fig = drawn(doc)
    axes = {ax.get_title().split("\n")[0]: ax for ax in fig.figure.get_axes() if ax.get_visible()}
    scatter = axes["does the weight metric predict the cost?"]
    bars = [c for c in scatter.collections if isinstance(c, LineCollection)]
    assert bars and all(len(c.get_segments()) == 6 * 9 for c in bars)
    segment = bars[0].get_segments()[0]
    assert abs(segment[1][1] - segment[0][1]) == pytest.approx(2 * 0.002)
    assert any(isinstance(c, LineCollection) for c in axes["truncating the rank"].collections)
    words = " ".join(t.get_text() for sub in fig.figure.subfigs for t in sub.texts).replace("\n", " ")
    assert "s.e. of each Δloss 0.002" in words
