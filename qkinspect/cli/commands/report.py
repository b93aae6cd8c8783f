"""`qkinspect report`: a multi-page, searchable PDF report (cover, summary, definitions, figures, tables)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from qkinspect.capabilities import folder_report, refuse_options
from qkinspect.cli.model_argument import refuse_analysis_options, result_of
from qkinspect.cli.options import (
    BlockOpt,
    Device,
    DeviceOpt,
    FoldLnOpt,
    FoldQkNormOpt,
    LayersOpt,
    ModelArg,
    Precision,
    PrecisionOpt,
    RevisionOpt,
)
from qkinspect.cli.output import note
from qkinspect.errors import InputError
from qkinspect.files import atomic_write, check_writable, write_rendered
from qkinspect.report.kinds import write_folder_report

if TYPE_CHECKING:
    from qkinspect.analysis.request import AnalysisRequest
    from qkinspect.experiment.results import ExperimentResult

# The report shows every default metric and the head-by-head overlap figure.
REPORT_METRICS = ("default", "shared_qk_distance", "head_overlap")

ReportOut = Annotated[Path | None, typer.Option("--output", "-o", metavar="FILE",
                                                help="The report file, .pdf (.html with --html; written atomically).")]
HtmlOpt = Annotated[bool, typer.Option("--html", help="Write one self-contained HTML page (figures as inline SVG) "
                                                      "instead of a PDF.")]
TitleOpt = Annotated[str | None, typer.Option(
    "--title", metavar="TEXT", help="What the report calls the model (or, for a sweep folder, what was swept): its "
    "title, footer and figure titles (the cover still gives the model's identity).")]
LayerFormOpt = Annotated[bool, typer.Option(
    "--layer-form", help="Also measure each layer's summed form Σ_h W_Q W_Kᵀ (costs O(d_model³) per layer).")]
ExperimentOpt = Annotated[Path | None, typer.Option(
    "--experiment", metavar="RUNS.json", help="Add an experiment section: the JSON `qkinspect experiment MODEL "
    "--format json -o RUNS.json` wrote for this same model (what sharing one matrix for queries and keys costs, "
    "which heads share it almost for free, whether the weight metric predicts it). PDF only.")]

CompositionOpt = Annotated[Path | None, typer.Option(
    "--composition", metavar="FILE.json", help="Add a composition section: the JSON `qkinspect composition MODEL "
    "-o FILE.json` wrote for this same model (which heads feed which, against the null). PDF only.")]


def register(app: typer.Typer) -> None:
    @app.command()
    def report(
        model: ModelArg = None, output: ReportOut = None, layers: LayersOpt = None, block: BlockOpt = None,
        fold_ln: FoldLnOpt = False, fold_qk_norm: FoldQkNormOpt = False, layer_form: LayerFormOpt = False,
        precision: PrecisionOpt = Precision.float32, device: DeviceOpt = Device.cpu, revision: RevisionOpt = None,
        html: HtmlOpt = False, experiment: ExperimentOpt = None, title: TitleOpt = None,
        composition: CompositionOpt = None,
    ) -> None:
        """Write a PDF report: the model's identity, a one-page summary in plain words, the definitions, every
        figure with a caption and per-layer tables; its text is searchable. --html writes the same as one web page.

        Example: qkinspect report ./my-bert -o report.pdf

        Example (a sweep's folder: what was swept, then each metric against training step): qkinspect report
        sweep/ -o sweep.pdf

        Example (an atlas folder: its models, then each metric against depth and size): qkinspect report atlas/
        -o atlas.pdf

        Example (a twin folder: the setup and its scale, the summary and verdicts, the learning, gap and
        trajectory figures): qkinspect report twin-out/ -o twin.pdf

        Example (a ladder folder, qkinspect twin --shapes: the shapes, the scaling fits, the scaling and gap
        figures): qkinspect report ladder/ -o ladder.pdf

        Example (a heads document: the strongest heads, the relations, the scatter figures): qkinspect heads
        ./my-llama -o heads.json; qkinspect report heads.json -o heads.pdf

        Example (with an experiment's runs.json): qkinspect report ./my-bert --experiment runs.json -o report.pdf

        Example (with heads composing): qkinspect composition ./my-llama -o c.json; qkinspect report ./my-llama
        --composition c.json -o report.pdf

        Example (from a saved analysis, without the model): qkinspect analyze ./my-bert --metrics
        default,shared_qk_distance,head_overlap -o run.json; qkinspect report run.json -o report.pdf
        """
        output = check_report_path(output, html=html)
        cap = folder_report(model)
        if cap is not None:  # a folder a capability saved: reported from its records alone
            refuse_options(cap, model, {"--experiment": experiment, "--composition": composition, "--layers": layers,
                                        "--block": block, "--fold-ln": fold_ln, "--fold-qk-norm": fold_qk_norm,
                                        "--layer-form": layer_form, "--revision": revision,
                                        "--precision": precision is not Precision.float32,
                                        "--device": device is not Device.cpu})
            n = write_folder_report(cap, Path(model), output, html=html, title=title)
            what = cap.report_noun
            note(f"wrote an HTML {what} report to {output}" if html else f"wrote {pages(n)} {what} report to {output}")
            return
        runs = read_section(experiment, "--experiment", html=html)
        composed = read_section(composition, "--composition", html=html)
        refuse_analysis_options(model, layers=layers, block=block, fold_ln=fold_ln, fold_qk_norm=fold_qk_norm,
                                layer_form=layer_form, precision=precision is not Precision.float32,
                                device=device is not Device.cpu, revision=revision)
        from qkinspect.analysis.request import CLI_NAMES, check_request

        request = check_request(list(REPORT_METRICS), precision=precision, device=device, fold_ln=fold_ln,
                                fold_qk_norm=fold_qk_norm, layer_form=layer_form, names=CLI_NAMES, layers=layers,
                                blocks=block)
        if html:
            write_html_report(model, output, request, revision=revision, title=title)
            note(f"wrote an HTML report to {output}")
            return
        n = write_report(model, output, request, revision=revision, experiment=runs, title=title,
                         composition=composed)
        note(f"wrote {pages(n)} report to {output}")


def check_report_path(output: Path | None, html: bool = False) -> Path:
    """The -o path, refused (InputError) when missing, not .pdf (.html with --html), or not writable."""
    kind, suffixes = ("HTML", (".html", ".htm")) if html else ("PDF", (".pdf",))
    if output is None:
        raise InputError(f"report writes a file: give -o FILE{suffixes[0]}")
    if output.suffix.lower() not in suffixes:
        hint = "" if html else " (or use --html for an .html page)"
        raise InputError(f"-o {output}: report writes {kind}; name the file *{suffixes[0]}{hint}")
    check_writable(output)
    return output


def read_section(path: Path | None, option: str, *, html: bool = False):
    """The document an --experiment or --composition section reads (None without the option): the experiment's
    records with its path (qkinspect.experiment.saved), or the composition; InputError where it cannot go."""
    if path is None:
        return None
    if html:
        raise InputError(f"{option} {path}: the {option[2:]} section is in a model's PDF report only; leave out "
                         "--html")
    if option == "--experiment":
        from qkinspect.experiment.saved import read_experiment

        return read_experiment(path), path
    from qkinspect.composition.saved import read_composition

    return read_composition(path)


def write_report(model: str | None, output: Path, request: AnalysisRequest, *, revision: str | None = None,
                 experiment: tuple[ExperimentResult, Path] | None = None, title: str | None = None,
                 composition=None) -> int:
    """Analyse `model` for the checked `request` (or read a saved analysis) and write the PDF report atomically to
    `output`; returns the number of pages. `experiment` (read_section) adds the experiment section; InputError when it
    was run on another model (the demo model's report: `write_report(None, Path("r.pdf"), check_request())`)."""
    from qkinspect.layer import shape_differences

    result = result_of(model, request, revision=revision)
    from qkinspect.report.analysis.pdf import write_pdf  # matplotlib: after the checks, so that errors come fast

    if experiment is not None:
        from qkinspect.experiment.saved import check_same_model

        check_same_model(experiment[0], result.model, experiment[1])
    if composition is not None and (diff := shape_differences(composition.model, result.model)):
        raise InputError(f"--composition: computed on {composition.model.name}, another shape ({diff[0]})")
    # rendered in memory, then written: a full disk is an OSError of that write, not an error inside matplotlib
    return write_rendered(output, lambda buffer: write_pdf(result, buffer, experiment=experiment, title=title,
                                                           composition=composition))


def write_html_report(model: str | None, output: Path, request: AnalysisRequest, *, revision: str | None = None,
                      title: str | None = None) -> None:
    """Analyse `model` for the checked `request` (or read a saved analysis) and write the HTML report atomically
    to `output`."""
    from qkinspect.report.analysis.html import render_html

    result = result_of(model, request, revision=revision)
    page = render_html(result, title=title)
    atomic_write(output, lambda f: f.write(page))


def pages(n: int) -> str:
    """'a 5-page', 'an 8-page', 'an 11-page', 'a 110-page': the article goes by how the number is said. It starts
    with a vowel sound when it begins "eight…" (8, 8x, 8xx, 8,xxx …) or "eleven"/"eighteen" (11, 18, 11,xxx,
    18,xxx …: the leading group of digits is 11 or 18)."""
    s = str(n)
    lead = s[: len(s) % 3 or 3]  # the leading group of thousands: 11 in 11000, 110 in 110000
    vowel = s[0] == "8" or lead in ("11", "18")
    return f"{'an' if vowel else 'a'} {n}-page"
