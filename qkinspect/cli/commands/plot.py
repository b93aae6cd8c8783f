"""`qkinspect plot`: one figure (symmetry, overlap, spectra, rank, distribution, heads, compare, metric) as PNG, SVG
or PDF."""

from __future__ import annotations

import dataclasses
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from qkinspect.capabilities import FROM_MODEL, all_figures, figure_source, refuse_options
from qkinspect.cli.model_argument import composition_of, refuse_analysis_options, result_of
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
    parse_blocks,
)
from qkinspect.cli.output import note
from qkinspect.errors import InputError
from qkinspect.files import check_writable, write_rendered
from qkinspect.selection import parse_indices

FIGURE_SUFFIXES = (".png", ".svg", ".pdf")
# The heads figure reads the layer records' head-by-head overlap matrices, which are opt-in.
HEADS_METRICS = ("default", "head_overlap")


Kind = Enum("Kind", {k: k for k in all_figures()}, type=str)  # every capability's figures (qkinspect.capabilities)

KindOpt = Annotated[Kind | None, typer.Option(
    "--kind", "-k", metavar="KIND", show_default="symmetry",
    help="Which figure to draw: " + ", ".join(k.value for k in Kind) + ".")]
FigureOut = Annotated[Path | None, typer.Option("--output", "-o", metavar="FILE",
                                                help="The figure file: .png, .svg or .pdf (written atomically).")]
MetricOpt = Annotated[str | None, typer.Option(
    "--metric", metavar="NAME", help="--kind metric: the per-head metric to map (any of `qkinspect analyze "
    "--metrics`' head metrics, e.g. shared_qk_distance, qk_stable_rank, cka_qv); --kind trajectory: the metric a "
    "sweep computed or a twin folder tracked.")]
LayerOpt = Annotated[int | None, typer.Option(
    "--layer", metavar="N", help="--kind heads: the layer to show (default: every layer as small multiples).")]
ExperimentOpt = Annotated[Path | None, typer.Option(
    "--experiment", metavar="FILE.json", help="--kind experiment / costmap / healing: the JSON `qkinspect "
                                               "experiment -o FILE.json` wrote (costmap: with --estimate; healing: "
                                               "with --heal-eval-every).")]
TitleOpt = Annotated[str | None, typer.Option(
    "--title", metavar="TEXT", help="The figure's title instead of the model's name and what is shown (wrapped to "
    "fit the figure, like every title).")]
CompareOpt = Annotated[str | None, typer.Option(
    "--compare", metavar="MODEL_B", help="--kind compare: the second model; the figure shows B − A per head.")]
ScoreOpt = Annotated[str | None, typer.Option(
    "--score", metavar="NAME", help="A heads document (qkinspect heads -o FILE.json): the behaviour score to draw "
    "against --metric (previous_token, induction, duplicate_token, self, first_token, entropy).")]


def register(app: typer.Typer) -> None:
    @app.command()
    def plot(
        model: ModelArg = None, kind: KindOpt = None, output: FigureOut = None, layer: LayerOpt = None,
        compare: CompareOpt = None, metric: MetricOpt = None, layers: LayersOpt = None, block: BlockOpt = None,
        fold_ln: FoldLnOpt = False, fold_qk_norm: FoldQkNormOpt = False, precision: PrecisionOpt = Precision.float32,
        device: DeviceOpt = Device.cpu, revision: RevisionOpt = None, experiment: ExperimentOpt = None,
        title: TitleOpt = None, score: ScoreOpt = None,
    ) -> None:
        """Draw one figure of the attention geometry (heatmaps of symmetry or Q/K/V overlap, singular-value spectra,
        ranks by layer, the symmetry histogram against chance, head-by-head overlap, a two-model comparison, or a
        heatmap of any per-head metric).

        Example: qkinspect plot ./my-bert --kind symmetry -o symmetry.png

        Example: qkinspect plot ./my-bert --kind metric --metric shared_qk_distance -o shared.pdf

        Example (a title of your own): qkinspect plot ./my-bert --title "BERT-base: symmetry per head" -o s.pdf

        Example (a sweep's folder, metric against training step): qkinspect plot sweep/ --kind trajectory
        --metric symmetry -o symmetry-by-step.png

        Example: qkinspect plot --kind experiment --experiment runs.json -o experiment.png

        Example (a twin folder: held-out loss over training, the paired gap to the standard twin, or a tracked
        metric per layer): qkinspect plot twin-out/ --kind learning -o learning.png; qkinspect plot twin-out/ --kind
        gap -o gap.png; qkinspect plot twin-out/ --kind trajectory --metric symmetry -o symmetry.png

        Example (a ladder folder, qkinspect twin --shapes: each variant's gap against model size with its power-law
        fit): qkinspect plot ladder/ --kind scaling -o scaling.png

        Example (an atlas folder: a metric against normalised depth, one line per model; or the medians against
        attention parameters): qkinspect plot atlas/ --kind depth --metric overlap_qk -o depth.png; qkinspect plot
        atlas/ --kind size --metric symmetry_layer -o size.png

        Example (from a saved analysis, without the model): qkinspect analyze ./my-bert -o run.json; qkinspect plot
        run.json --kind rank -o rank.png

        Example (the estimated cost of every head): qkinspect plot --kind costmap --experiment map.json -o map.png

        Example (a heads document: a weight metric against a behaviour score, one dot per head): qkinspect plot
        heads.json --kind heads --metric symmetry --score self -o self.png

        Example (heads composing, from the model or a saved `qkinspect composition -o c.json`): qkinspect plot
        ./my-llama --kind composition -o composition.png
        """
        output = check_figure_path(output)
        cap, kind = figure_source(model, kind and kind.value)
        given = {"--layers": layers, "--block": block, "--layer": layer, "--compare": compare,
                 "--experiment": experiment, "--revision": revision, "--fold-ln": fold_ln,
                 "--fold-qk-norm": fold_qk_norm, "--score": score,
                 "--precision": precision is not Precision.float32, "--device": device is not Device.cpu}
        refuse_options(cap, model, given)
        if cap.name in FROM_MODEL:
            fig, drawn = draw_from_model(cap, model, kind, output, layer=layer, compare=compare, metric=metric,
                                         layers=layers, block=block, fold_ln=fold_ln, fold_qk_norm=fold_qk_norm,
                                         precision=precision, device=device, revision=revision,
                                         experiment=experiment, title=title)
        elif cap.from_option:
            if experiment is None:
                raise InputError(f"--kind {kind} needs --experiment FILE.json (from qkinspect experiment -o)")
            fig, drawn = cap.get("draw")(cap.get("read")(experiment), kind, title=title)
        else:  # a folder or document a capability saved: drawn from its records alone
            result = cap.get("read")(Path(model))
            fig, drawn = cap.get("draw")(result, kind, metric=metric, score=score, title=title,
                                         layers=parse_indices(layers, "--layers"), blocks=parse_blocks(block))
        save_figure(fig, output)
        note(f"wrote the {drawn} to {output}")


def draw_from_model(cap, model: str | None, kind: str, output: Path, *, layer, compare, metric, layers, block,
                    fold_ln, fold_qk_norm, precision, device, revision, experiment, title):
    """The figure `kind` of an analysis or a composition, computed on `model` or read from what was saved."""
    if experiment is not None:
        raise InputError("--experiment applies to --kind experiment, costmap or healing only")
    if cap.name == "composition":
        result = composition_of(model, layers=layers, block=block, precision=precision, device=device,
                                revision=revision)
        return cap.get("draw")(result, kind, title=title)
    refuse_analysis_options(model, layers=layers, block=block, fold_ln=fold_ln, fold_qk_norm=fold_qk_norm,
                            precision=precision is not Precision.float32, device=device is not Device.cpu,
                            revision=revision)
    if kind == "compare" and compare is None:
        raise InputError("--kind compare needs a second model: --compare MODEL_B")
    if compare is not None and kind != "compare":
        raise InputError(f"--compare applies to --kind compare only, not --kind {kind}")
    if layer is not None and kind != "heads":
        raise InputError(f"--layer applies to --kind heads only (use --layers to select layers for {kind})")
    if (kind == "metric") != (metric is not None):
        raise InputError("--kind metric needs --metric NAME" if metric is None
                         else f"--metric applies to --kind metric only, not --kind {kind}")
    from qkinspect.analysis.request import CLI_NAMES, check_head_metric, check_request

    metrics = list(HEADS_METRICS) if kind == "heads" else [check_head_metric(metric, CLI_NAMES)] if metric else None
    request = check_request(metrics, precision=precision, device=device, fold_ln=fold_ln, fold_qk_norm=fold_qk_norm,
                            names=CLI_NAMES, layers=layers, blocks=block, layer=layer)
    if layer is not None and request.layers is not None and layer not in request.layers:
        raise InputError(f"--layer {layer} is not among --layers {layers}")
    result = result_of(model, request, kind=kind, revision=revision)
    other = result_of(compare, dataclasses.replace(request, layer=None), kind=kind) if compare is not None else None
    return cap.get("draw")(result, kind, metric=metric, title=title, layer=layer, other=other)


def check_figure_path(output: Path | None) -> Path:
    """The -o path, refused (InputError) when missing or not .png/.svg/.pdf, or when it cannot be written."""
    if output is None:
        raise InputError("plot writes a file: give -o FILE.png (or .svg, .pdf)")
    if output.suffix.lower() not in FIGURE_SUFFIXES:
        raise InputError(f"-o {output}: plot writes {', '.join(FIGURE_SUFFIXES)}; name the file with one of them")
    check_writable(output)
    return output


def save_figure(fig, output: Path) -> None:
    """Save a matplotlib Figure atomically; the format follows the file's extension."""
    from qkinspect.report.style import style

    fmt = output.suffix.lower().lstrip(".")
    with style():
        write_rendered(output, lambda buffer: fig.savefig(buffer, format=fmt))  # in memory: a full disk is OSError
