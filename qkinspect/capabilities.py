"""The contract every capability keeps, on one page: for each, its request check (in the caller's names), its one
library call, its result type, its saved reader and predicate ("is it one of mine"), its figures (`plot --kind`)
and its report pages. `plot` and `report` read this list; a new capability adds an entry here, not a branch there
(ARCHITECTURE.md, "The contract").

Every entry names its pieces as "module:attribute", imported only when used: reading the list costs nothing, so
`plot` and `report` can ask every predicate of a model argument without loading numpy or torch.

    >>> saved_by("twin-out/").name  # doctest: +SKIP
    'twin'
    >>> [c.name for c in CAPABILITIES if "trajectory" in c.figures]
    ['sweep', 'twin']
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from qkinspect.errors import InputError


@dataclass(frozen=True)
class Capability:
    """One capability's contract. Each piece is "module:attribute" (None: the capability has none).

    - `request`: the request check, in the caller's option names; `call`: the one library call; `result`: its
      result type (`document()` is what `-o FILE.json` and `save()` write);
    - `read` / `is_saved`: the checked reader of what it saved, and the predicate that tells a model argument
      that is one (asked in CAPABILITIES' order: the most particular first);
    - `figures`: the `plot --kind`s drawn from what it saved (the first is the default), `draw` the function
      `draw(result, kind, metric=, title=, **)` that draws them; `from_option`: the option that names the saved
      document when the model argument does not (`--experiment`);
    - `pdf` / `html`: its report pages (`pdf(result, buffer, title=) -> pages`, `html(result, name=) -> str`);
    - `noun`: what the saved thing is called in messages ("a twin folder"); `takes`: the plot/report options
      its figures and report take (others are refused, naming them: `refusal`, formatted with `named`, `model`);
      `needs`: the refusal of one of its figures asked of something else; `other_kind`: the refusal of a figure
      it does not draw (formatted with `kind`, `kinds`, `model`);
    - `report_noun`: what its report is called ("an 8-page twin ladder report"); `filled`: the result's attribute
      that is empty while nothing has finished (none: it is never empty), and `empty`, the refusal then.
    """

    name: str
    call: str
    result: str
    request: str | None = None
    read: str | None = None
    is_saved: str | None = None
    figures: tuple[str, ...] = ()
    draw: str | None = None
    from_option: str | None = None
    pdf: str | None = None
    html: str | None = None
    noun: str = ""
    takes: tuple[str, ...] = ()
    refusal: str = "{named}: not for {noun} ({model})"  # a folder's own words replace it
    needs: str = ""
    other_kind: str = "--kind {kind}: {noun} draws {kinds}"
    report_noun: str = ""
    filled: str = ""
    empty: str = ""

    def get(self, piece: str) -> Any:
        """The object a piece names (`cap.get("read")(folder)`), imported now."""
        where = getattr(self, piece)
        if where is None:
            raise AttributeError(f"the {self.name} capability has no {piece}")
        module, _, attribute = where.partition(":")
        return getattr(importlib.import_module(module), attribute)

    def holds(self, spec: object) -> bool:
        """Whether the model argument `spec` is something this capability saved."""
        return self.is_saved is not None and spec is not None and bool(self.get("is_saved")(spec))

    def kinds_text(self) -> str:
        """Its figures as a message names them: "--kind learning, gap or trajectory"."""
        *first, last = self.figures
        return f"--kind {', '.join(first)} or {last}" if first else f"--kind {last}"


ANALYSIS_FIGURES = ("symmetry", "overlap", "spectra", "rank", "distribution", "heads", "compare", "metric")

CAPABILITIES: tuple[Capability, ...] = (
    Capability(
        # its request: the engine's options and the analysis's (checked against each checkpoint's shapes once the
        # first are described, before any analysis)
        "sweep", request="qkinspect.sweep.request:check_request", call="qkinspect.sweep:run_sweep",
        result="qkinspect.sweep.store:SweepResult", read="qkinspect.sweep.store:read",
        is_saved="qkinspect.sweep.store:is_saved", figures=("trajectory",),
        draw="qkinspect.report.kinds:sweep_figure", pdf="qkinspect.report.sweep.pdf:write_sweep_pdf",
        html="qkinspect.report.sweep.html:render_sweep_html", noun="a sweep folder", report_noun="sweep",
        filled="results", empty="{folder}: the sweep has no results yet",
        takes=("--kind", "--metric", "--title", "--layers", "--block"),
        refusal="{named}: not for a sweep folder ({model}); its figures and report are drawn from its records "
                "alone (plot takes --kind trajectory --metric NAME, --layers, --block; both take --title)",
        needs="--kind {kind}: draws a sweep folder (qkinspect sweep --out FOLDER) or a twin folder; {model} is not "
              "one (it has no sweep.json)"),
    Capability(
        "twin", request="qkinspect.twin.request:check_request", call="qkinspect.twin.run:twin",
        result="qkinspect.twin.results:TwinResult", read="qkinspect.twin.saved:read",
        is_saved="qkinspect.twin.saved:is_saved", figures=("learning", "gap", "trajectory"),
        draw="qkinspect.report.kinds:twin_figure", pdf="qkinspect.report.twin.pdf:write_twin_pdf",
        html="qkinspect.report.twin.html:render_twin_html", noun="a twin folder",
        takes=("--kind", "--metric", "--title"),
        report_noun="twin", filled="summaries", empty="{folder}: the twin folder has no finished runs yet",
        other_kind="--kind {kind}: a twin folder draws --kind learning, gap or trajectory --metric NAME",
        refusal="{named}: not for a twin folder ({model}); its figures and report are drawn from its records alone "
                "(plot takes --kind learning, gap or trajectory --metric NAME; both take --title)",
        needs="--kind {kind}: draws a twin folder (qkinspect twin --out FOLDER); {model} is not one (it has no "
              "twin.json)"),
    # its document comes by --experiment, never as the model argument: the list names its reader and no predicate
    # (experiment/saved.py has `is_saved` too, for a caller's own use)
    Capability(
        "experiment", request="qkinspect.experiment.requests:check_request",
        call="qkinspect.experiment.run:run_experiment", result="qkinspect.experiment.results:ExperimentResult",
        read="qkinspect.experiment.saved:read", figures=("experiment", "costmap", "healing"),
        draw="qkinspect.report.kinds:experiment_figure", from_option="--experiment", noun="an experiment document"),
    Capability(
        "composition", request="qkinspect.composition.request:check_request",
        call="qkinspect.composition.run:composition", result="qkinspect.composition.results:CompositionResult",
        read="qkinspect.composition.saved:read",
        is_saved="qkinspect.composition.saved:is_saved", figures=("composition",),
        draw="qkinspect.report.kinds:composition_figure", noun="a saved composition"),
    Capability(
        "heads", request="qkinspect.heads.request:check_request", call="qkinspect.heads.run:heads",
        result="qkinspect.heads.results:HeadsResult", read="qkinspect.heads.saved:read",
        is_saved="qkinspect.heads.saved:is_saved", figures=("heads",), draw="qkinspect.report.kinds:heads_figure",
        pdf="qkinspect.report.heads.page:write_heads_pdf", html="qkinspect.report.heads.page:render_heads_html",
        noun="a heads document", report_noun="heads", takes=("--kind", "--metric", "--score", "--title"),
        refusal="{named}: not for a heads document ({model}); its figures and report are drawn from its records "
                "alone (plot takes --kind heads --metric NAME --score NAME; both take --title)",
        needs="--score: draws a heads document (qkinspect heads -o FILE.json); {model} is not one",
        other_kind="--kind {kind}: a heads document draws --kind heads (--metric NAME --score NAME)"),
    Capability(
        "atlas", request="qkinspect.atlas.request:check_request", call="qkinspect.atlas.run:atlas",
        result="qkinspect.atlas.results:AtlasResult", read="qkinspect.atlas.saved:read",
        is_saved="qkinspect.atlas.saved:is_saved", figures=("depth", "size"),
        draw="qkinspect.report.kinds:atlas_figure", pdf="qkinspect.report.atlas.pdf:write_atlas_pdf",
        html="qkinspect.report.atlas.html:render_atlas_html", noun="an atlas folder", report_noun="atlas",
        filled="records", empty="{folder}: the atlas has no results yet",
        other_kind="--kind {kind}: an atlas folder draws --kind depth or --kind size",
        takes=("--kind", "--metric", "--title"),
        refusal="{named}: not for an atlas folder ({model}); its figures and report are drawn from its records "
                "alone (plot takes --kind depth or size, --metric NAME; both take --title)",
        needs="--kind {kind}: draws an atlas folder (qkinspect atlas --out FOLDER); {model} is not one (it has no "
              "atlas.json)"),
    Capability(
        "ladder", request="qkinspect.twin.request:check_request", call="qkinspect.twin.run:twin",
        result="qkinspect.twin.ladder:LadderResult", read="qkinspect.twin.ladder:read",
        is_saved="qkinspect.twin.ladder:is_saved", figures=("scaling",),
        draw="qkinspect.report.kinds:ladder_figure", pdf="qkinspect.report.twin.ladder:write_ladder_pdf",
        html="qkinspect.report.twin.ladder:render_ladder_html", noun="a ladder folder", takes=("--kind", "--title"),
        report_noun="twin ladder", filled="summaries", empty="{folder}: the ladder folder has no finished runs yet",
        refusal="{named}: not for a twin folder ({model}); its figures and report are drawn from its records alone "
                "(plot takes --kind learning, gap or trajectory --metric NAME; both take --title)",
        needs="--kind {kind}: draws a ladder folder (qkinspect twin --shapes LxD,... --out FOLDER); {model} is not "
              "one (it has no ladder.json)",
        other_kind="--kind {kind}: a ladder folder draws --kind scaling; each shape's twin folder ({model}/LxD) "
                   "draws learning, gap and trajectory"),
    # its JSON is written (-o FILE.json) and its PDF beside the table; nothing reads a directions document back, so
    # it has no saved module (no reader, no predicate)
    Capability(
        "directions", request="qkinspect.directions.request:check_request", call="qkinspect.directions.run:directions",
        result="qkinspect.directions.results:DirectionsResult",
        pdf="qkinspect.report.directions.pdf:write_directions_pdf"),
    # a training run's tracked checkpoints are a sweep folder: its options checked as a sweep's (by the sweep's
    # request, when the Tracker is made: once, before the first step is measured), its folder read, drawn and
    # reported as the sweep's
    Capability("tracking", request="qkinspect.sweep.request:check_request", call="qkinspect.callback:track",
               result="qkinspect.sweep.store:SweepResult"),
    # last: its predicate holds of any .json file
    Capability(
        "analysis", request="qkinspect.analysis.request:check_request", call="qkinspect.analysis.run:analyze",
        result="qkinspect.analysis.results:AnalysisResult", read="qkinspect.analysis.saved:read",
        is_saved="qkinspect.analysis.saved:is_saved", figures=ANALYSIS_FIGURES,
        draw="qkinspect.report.kinds:analysis_figure", pdf="qkinspect.report.analysis.pdf:write_pdf",
        html="qkinspect.report.analysis.html:render_html", noun="a saved analysis"),
)
# The capabilities computed on a model when the model argument is none of the saved things above.
FROM_MODEL = ("analysis", "composition")


def capability(name: str) -> Capability:
    """The entry named `name`."""
    return next(c for c in CAPABILITIES if c.name == name)


def saved_by(spec: object) -> Capability | None:
    """The capability that saved the model argument `spec` (a folder or document), or None (a model)."""
    return next((c for c in CAPABILITIES if c.holds(spec)), None)


def folder_report(spec: object) -> Capability | None:
    """The capability whose folder `spec` is, when it has report pages of its own (a sweep, atlas, twin or ladder
    folder); None for a model or a saved analysis (the analysis report)."""
    cap = saved_by(spec)
    return cap if cap is not None and cap.name not in FROM_MODEL and cap.pdf else None


def all_figures() -> tuple[str, ...]:
    """Every `plot --kind`, in the list's order of capabilities (the analysis's first)."""
    kinds = [*ANALYSIS_FIGURES]
    for c in CAPABILITIES:
        kinds += [k for k in c.figures if k not in kinds]
    return tuple(kinds)


def figure_source(spec: object, kind: str | None) -> tuple[Capability, str]:
    """Which capability draws figure `kind` of the model argument `spec`, and the kind (its default when None).

    Raises:
        InputError: one line naming the kinds that apply, when `kind` is not one `spec` can give.
    """
    cap = saved_by(spec)
    if cap is not None and cap.name not in FROM_MODEL:  # a folder: its own figures only
        if kind is None or kind in cap.figures:
            return cap, kind or cap.figures[0]
        if cap.name == "sweep":
            from qkinspect.report.kinds import refuse_sweep_kind

            refuse_sweep_kind(spec, kind)
        raise InputError(cap.other_kind.format(kind=kind, noun=cap.noun, kinds=cap.kinds_text(), model=spec))
    kind = kind or ANALYSIS_FIGURES[0]
    owners = [c for c in CAPABILITIES if kind in c.figures]
    drawn = [c for c in owners if c.name in FROM_MODEL or c.from_option]
    if drawn:
        return drawn[0], kind
    owner = owners[0]
    raise InputError(owner.needs.format(kind=kind, model=spec or "no folder given"))


def refuse_options(cap: Capability, spec: object, given: dict[str, object]) -> None:
    """InputError naming the options in `given` (option -> its value, or whether it differs from its default)
    that were set and that `cap`'s figures and report do not take; for a model, an option only a saved thing's
    figures take (--score) is refused with what that saved thing is."""
    named = [k for k, v in given.items() if k not in cap.takes and v not in (None, False, [], ())]
    owner = next((c for c in CAPABILITIES for k in named if k in c.takes and c.needs.startswith(k)), None)
    if owner is not None and cap.name in FROM_MODEL:
        raise InputError(owner.needs.format(model=spec or "no file given"))
    if named and cap.is_saved is not None and cap.name not in FROM_MODEL:
        raise InputError(cap.refusal.format(named=", ".join(named), noun=cap.noun, model=spec))


__all__ = ["CAPABILITIES", "Capability", "all_figures", "capability", "figure_source", "folder_report",
           "refuse_options", "saved_by"]
