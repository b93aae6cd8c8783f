"""`qkinspect plot`: one figure (symmetry, overlap, spectra, rank, distribution, heads, compare, metric) as PNG, SVG
or PDF."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

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
    Selection,
)
from qkinspect.cli.output import note
from qkinspect.errors import InputError
from qkinspect.files import atomic_write_file, check_writable
from qkinspect.metrics.registry import head_metric

FIGURE_SUFFIXES = (".png", ".svg", ".pdf")
# The heads figure reads the layer records' head-by-head overlap matrices, which are opt-in.
HEADS_METRICS = ("default", "head_overlap")


class Kind(str, Enum):
    symmetry = "symmetry"
    overlap = "overlap"
    spectra = "spectra"
    rank = "rank"
    distribution = "distribution"
    heads = "heads"
    compare = "compare"
    metric = "metric"
    trajectory = "trajectory"
    experiment = "experiment"
    costmap = "costmap"


KindOpt = Annotated[Kind, typer.Option("--kind", "-k", metavar="KIND", help="Which figure to draw: "
                                        + ", ".join(k.value for k in Kind) + ".")]
FigureOut = Annotated[Path | None, typer.Option("--output", "-o", metavar="FILE",
                                                help="The figure file: .png, .svg or .pdf (written atomically).")]
MetricOpt = Annotated[str | None, typer.Option(
    "--metric", metavar="NAME", help="--kind metric: the per-head metric to map (any of `qkinspect analyze "
    "--metrics`' head metrics, e.g. shared_qk_distance, qk_stable_rank, cka_qv).")]
LayerOpt = Annotated[int | None, typer.Option(
    "--layer", metavar="N", help="--kind heads: the layer to show (default: every layer as small multiples).")]
ExperimentOpt = Annotated[Path | None, typer.Option(
    "--experiment", metavar="FILE.json", help="--kind experiment / costmap: the JSON `qkinspect experiment -o "
                                               "FILE.json` wrote (costmap: with --estimate).")]
CompareOpt = Annotated[str | None, typer.Option(
    "--compare", metavar="MODEL_B", help="--kind compare: the second model; the figure shows B − A per head.")]


def register(app: typer.Typer) -> None:
    @app.command()
    def plot(
        model: ModelArg = None, kind: KindOpt = Kind.symmetry, output: FigureOut = None, layer: LayerOpt = None,
        compare: CompareOpt = None, metric: MetricOpt = None, layers: LayersOpt = None, block: BlockOpt = None,
        fold_ln: FoldLnOpt = False, fold_qk_norm: FoldQkNormOpt = False, precision: PrecisionOpt = Precision.float32,
        device: DeviceOpt = Device.cpu, revision: RevisionOpt = None, experiment: ExperimentOpt = None,
    ) -> None:
        """Draw one figure of the attention geometry (heatmaps of symmetry or Q/K/V overlap, singular-value spectra,
        ranks by layer, the symmetry histogram against chance, head-by-head overlap, a two-model comparison, or a
        heatmap of any per-head metric).

        Example: qkinspect plot ./my-bert --kind symmetry -o symmetry.png

        Example: qkinspect plot ./my-bert --kind metric --metric shared_qk_distance -o shared.pdf

        Example (a sweep's folder, metric against training step): qkinspect plot sweep/ --kind trajectory
        --metric symmetry -o symmetry-by-step.png

        Example: qkinspect plot --kind experiment --experiment runs.json -o experiment.png

        Example (the estimated cost of every head): qkinspect plot --kind costmap --experiment map.json -o map.png
        """
        output = check_figure_path(output)
        if kind is Kind.trajectory:
            draw_trajectory(Path(model or "."), metric or "symmetry", output, layers=layers, blocks=block)
            note(f"wrote the {metric or 'symmetry'} trajectory to {output}")
            return
        from_runs = kind in (Kind.experiment, Kind.costmap)
        if from_runs != (experiment is not None):
            raise InputError(f"--kind {kind.value} needs --experiment FILE.json (from qkinspect experiment -o)"
                             if experiment is None else "--experiment applies to --kind experiment or costmap only")
        if experiment is not None:
            from qkinspect.report.costmap import costmap_figure
            from qkinspect.report.experiment import experiment_figure, read_experiment
            from qkinspect.report.style import style

            draw_runs = costmap_figure if kind is Kind.costmap else experiment_figure
            with style():
                save_figure(draw_runs(read_experiment(experiment)), output)
            note(f"wrote the {kind.value} figure to {output}")
            return
        if kind is Kind.compare and compare is None:
            raise InputError("--kind compare needs a second model: --compare MODEL_B")
        if compare is not None and kind is not Kind.compare:
            raise InputError(f"--compare applies to --kind compare only, not --kind {kind.value}")
        if layer is not None and kind is not Kind.heads:
            raise InputError(f"--layer applies to --kind heads only (use --layers to select layers for {kind.value})")
        if (kind is Kind.metric) != (metric is not None):
            raise InputError("--kind metric needs --metric NAME" if metric is None
                             else f"--metric applies to --kind metric only, not --kind {kind.value}")
        metrics = list(HEADS_METRICS) if kind is Kind.heads else [head_metric(metric).name] if metric else None
        sel = Selection.parse(layers=layers, blocks=block, metrics=metrics, precision=precision, device=device,
                              fold_ln=fold_ln, fold_qk_norm=fold_qk_norm)
        if layer is not None and sel.layers is not None and layer not in sel.layers:
            raise InputError(f"--layer {layer} is not among --layers {layers}")
        draw_figure(model, kind.value, output, sel, layer=layer, other=compare, metric=metric, revision=revision)
        note(f"wrote the {metric or kind.value} figure to {output}")


def check_figure_path(output: Path | None) -> Path:
    """The -o path, refused (InputError) when missing or not .png/.svg/.pdf, or when it cannot be written."""
    if output is None:
        raise InputError("plot writes a file: give -o FILE.png (or .svg, .pdf)")
    if output.suffix.lower() not in FIGURE_SUFFIXES:
        raise InputError(f"-o {output}: plot writes {', '.join(FIGURE_SUFFIXES)}; name the file with one of them")
    check_writable(output)
    return output


def draw_figure(model: str | None, kind: str, output: Path, selection: Selection, *, layer: int | None = None,
                other: str | None = None, metric: str | None = None, revision: str | None = None) -> None:
    """Analyse `model` (and `other` for compare), draw the figure `kind` and save it atomically to `output`.

    Example:
        >>> draw_figure(None, "symmetry", Path("symmetry.png"), Selection.parse())
    """
    from qkinspect.cli.options import check_selection
    from qkinspect.cli.run import run_analysis
    from qkinspect.loading import open_model

    with open_model(model, revision=revision) as m:
        if layer is not None:  # answered with the option the user typed, before any work
            check_selection(m.info, selection.blocks, (layer,), options=("--layer", "--heads"))
        result = run_analysis(m, selection)
    result_b = run_analysis(other, selection) if other is not None else None
    from qkinspect.report.figures import figure  # matplotlib: after the checks, so that errors come fast
    # the heads figure takes the first selected block
    fig = figure(result, kind, layer=layer, other=result_b, metric_name=metric)
    save_figure(fig, output)


def draw_trajectory(folder: Path, metric: str, output: Path, *, layers: str | None = None,
                    blocks: list[str] | None = None) -> None:
    """The trajectory figure of a sweep folder's results (`qkinspect sweep --out FOLDER`), saved to `output`."""
    from qkinspect.cli.options import parse_blocks, parse_indices
    from qkinspect.report.trajectory import sweep_trajectory
    from qkinspect.sweep import read_sweep

    fig = sweep_trajectory(read_sweep(folder), metric, layers=parse_indices(layers, "--layers"),
                           blocks=parse_blocks(blocks))
    save_figure(fig, output)


def save_figure(fig, output: Path) -> None:
    """Save a matplotlib Figure atomically; the format follows the file's extension."""
    from qkinspect.report.style import style

    fmt = output.suffix.lower().lstrip(".")
    with style():
        atomic_write_file(output, lambda tmp: fig.savefig(tmp, format=fmt))
