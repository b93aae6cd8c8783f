"""The multi-page PDF report: a cover, a summary in plain words, definitions, every figure with a caption, and
per-layer tables. Pages are A4; all text is TrueType text, so the PDF is searchable.

Example:
    >>> import qkinspect
    >>> from qkinspect.report.analysis.pdf import write_pdf
    >>> n_pages = write_pdf(qkinspect.analyze(None), "report.pdf")
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from matplotlib.figure import Figure

from qkinspect.analysis.results import AnalysisResult
from qkinspect.errors import InputError
from qkinspect.experiment.results import ExperimentResult
from qkinspect.report.analysis import text
from qkinspect.report.analysis.arrays import blocks_of, renamed
from qkinspect.report.analysis.figures import figure, shows_raw_qk
from qkinspect.report.analysis.summary import qk_norm_caveat, summary
from qkinspect.report.analysis.tables import layer_tables
from qkinspect.report.pages import TextPages, figure_page, page_canvas, put_caption, report_pdf
from qkinspect.report.style import PAGE
from qkinspect.version import __version__


@dataclass(frozen=True)
class FigurePlan:
    """One figure page: the kind, its options, and the caption under it."""

    kind: str
    caption: str
    block: str | None = None


def plan_figures(result: AnalysisResult) -> list[FigurePlan]:
    """The figures the report shows, in order: one page per kind, and the head-by-head overlap per block."""
    plans = [FigurePlan(k, text.CAPTIONS[k]) for k in ("symmetry", "distribution", "overlap", "rank", "spectra")]
    for b in blocks_of(result):
        if any(r.block == b and r.head_overlap is not None for r in result.layers):
            plans.append(FigurePlan("heads", text.CAPTIONS["heads"], b))
    caveat = qk_norm_caveat(result)  # on the captions of the figures it concerns, as on the cover
    return [FigurePlan(p.kind, f"{p.caption} {caveat}", p.block) if caveat and shows_raw_qk(p.kind) else p
            for p in plans]


def write_pdf(result: AnalysisResult, target: str | Path | IO[bytes], *, date: dt.datetime | None = None,
              experiment: tuple[ExperimentResult, Path] | None = None, title: str | None = None,
              composition=None) -> int:
    """Write the report to `target` (a path or a binary file); returns the number of pages.
    The caller makes the write atomic (the CLI writes a temporary file and renames it). `experiment`, an
    experiment's records (`run_experiment`'s result, or its document read back by
    qkinspect.experiment.saved.read_experiment) and the path it is named by, adds the experiment section after the
    summary: its words, its figure and the cheapest and costliest heads. `title` names the
    model in the report's title, footer and figure titles (the cover still gives its identity). `composition`, a
    CompositionResult (qkinspect.composition), adds the composition section after the figures.

    Raises:
        InputError: the analysis holds no head records.
    """
    if not result.heads:
        raise InputError("the report needs at least one analysed head")
    date = date or dt.datetime.now(dt.timezone.utc)
    shown = renamed(result, title)
    with report_pdf(target, report="report", name=shown.model.name, version=__version__, date=date,
                    intro=text.COVER_INTRO, subject="query-key geometry of attention heads") as pages:
        text.cover(pages, result, date)
        pages.new_page()
        text.summary_page(pages, shown, summary(result))
        if experiment is not None:
            _experiment(pages, *experiment)
        pages.new_page()
        text.definitions(pages, result)
        skipped = _figures(pages, shown)
        if composition is not None:
            from qkinspect.report.composition.figures import composition_section

            composition_section(pages, composition, lambda draw, caption: figure_page(pages, draw, caption))
        pages.new_page()
        text.tables_intro(pages, skipped)
        for t in layer_tables(result):
            pages.table(t)
    return pages.count


def _figures(pages: TextPages, result: AnalysisResult) -> list[str]:
    """One page per planned figure; returns the reasons for figures that could not be drawn."""
    pages.flush()
    skipped = []
    for plan in plan_figures(result):
        page = Figure(figsize=PAGE, layout="constrained")
        slot: dict = {}
        try:
            figure(result, plan.kind, block=plan.block, canvas=page_canvas(page, slot))
        except InputError as e:
            skipped.append(f"{plan.kind}: {e}")
            continue
        put_caption(slot["caption"], plan.caption)
        pages.add_page(page)
    return skipped


def _experiment(pages: TextPages, result: ExperimentResult, path: Path) -> None:
    """The experiment section: its words, its figure (when it has one to draw) and its head tables."""
    from qkinspect.experiment.costs import edits
    from qkinspect.report.experiment import costmap
    from qkinspect.report.experiment import pages as experiment_pages
    from qkinspect.report.experiment.figure import experiment_figure

    pages.new_page()
    if costmap.estimated_edits(result):  # an estimated map (experiment --estimate): the section is built on it
        costmap.estimate_section(pages, result, path)
        pages.flush()
        page = Figure(figsize=PAGE, layout="constrained")
        slot: dict = {}
        costmap.costmap_figure(result, canvas=page_canvas(page, slot))
        put_caption(slot["caption"], costmap.CAPTION)
        pages.add_page(page)
        for e in costmap.estimated_edits(result):
            pages.table(costmap.estimate_table(result, e))
        pages.paragraph(costmap.TABLE_LEGEND, size=8, color="0.25")
        return
    experiment_pages.experiment_section(pages, result, path)
    pages.flush()
    page = Figure(figsize=PAGE, layout="constrained")
    slot = {}
    try:
        experiment_figure(result, canvas=page_canvas(page, slot))
    except InputError as e:
        pages.paragraph(f"No experiment figure: {e}.")
    else:
        put_caption(slot["caption"], experiment_pages.CAPTION)
        pages.add_page(page)
    for e in edits(result):
        if e != "ablate" and (t := experiment_pages.head_table(result, e)) is not None:
            pages.table(t)
