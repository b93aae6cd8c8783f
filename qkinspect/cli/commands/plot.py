"""`qkinspect plot`: one figure (symmetry, overlap, spectra, rank, distribution, heads, compare, metric) as PNG, SVG
or PDF."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from qkinspect.cli.model_argument import refuse_analysis_options, refuse_twin_options, result_of
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
from qkinspect.files import check_writable, write_rendered
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
    learning = "learning"
    gap = "gap"
    experiment = "experiment"
    costmap = "costmap"
    healing = "healing"
    composition = "composition"
    depth = "depth"
    size = "size"
    scaling = "scaling"


KindOpt = Annotated[Kind, typer.Option("--kind", "-k", metavar="KIND", help="Which figure to draw: "
                                        + ", ".join(k.value for k in Kind) + ".")]
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
        model: ModelArg = None, kind: KindOpt = Kind.symmetry, output: FigureOut = None, layer: LayerOpt = None,
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
        from qkinspect.heads.saved import is_heads

        if is_heads(model) or score is not None:
            drawn = draw_heads(model, kind, metric, score, output, title=title)
            note(f"wrote the {drawn} figure to {output}")
            return
        from qkinspect.atlas.folder import is_atlas
        from qkinspect.twin.ladder import is_ladder_folder
        from qkinspect.twin.saved import is_twin_folder

        if is_ladder_folder(model) or kind is Kind.scaling:
            refuse_twin_options(model, {"--layers": layers, "--block": block, "--layer": layer, "--compare": compare,
                                        "--experiment": experiment, "--revision": revision, "--fold-ln": fold_ln,
                                        "--fold-qk-norm": fold_qk_norm, "--metric": metric,
                                        "--precision": precision is not Precision.float32,
                                        "--device": device is not Device.cpu})
            draw_ladder(model, kind, output, title=title)
            note(f"wrote the scaling figure to {output}")
            return
        if is_twin_folder(model) or kind in (Kind.learning, Kind.gap):
            refuse_twin_options(model, {"--layers": layers, "--block": block, "--layer": layer, "--compare": compare,
                                        "--experiment": experiment, "--revision": revision, "--fold-ln": fold_ln,
                                        "--fold-qk-norm": fold_qk_norm,
                                        "--precision": precision is not Precision.float32,
                                        "--device": device is not Device.cpu})
            drawn = draw_twin(model, kind, metric, output, title=title)
            note(f"wrote the {drawn} figure to {output}")
            return

        if is_atlas(model) or kind in (Kind.depth, Kind.size):
            given = {"--layers": layers, "--block": block, "--layer": layer, "--compare": compare,
                     "--experiment": experiment, "--revision": revision}
            named = [k for k, v in given.items() if v]
            if named:
                raise InputError(f"{', '.join(named)}: not for an atlas folder's figures (--kind depth or size, "
                                 "--metric, --title)")
            drawn = draw_atlas(Path(model or "."), kind, metric, output, title=title)
            note(f"wrote the {drawn} figure to {output}")
            return
        if kind is Kind.composition:
            draw_composition(model, output, layers=layers, block=block, precision=precision, device=device,
                             revision=revision, title=title)
            note(f"wrote the composition figure to {output}")
            return
        if kind is Kind.trajectory:
            draw_trajectory(Path(model or "."), metric or "symmetry", output, layers=layers, blocks=block,
                            title=title)
            note(f"wrote the {metric or 'symmetry'} trajectory to {output}")
            return
        refuse_sweep_folder(model, kind.value)
        from_runs = kind in (Kind.experiment, Kind.costmap, Kind.healing)
        if from_runs != (experiment is not None):
            raise InputError(f"--kind {kind.value} needs --experiment FILE.json (from qkinspect experiment -o)"
                             if experiment is None
                             else "--experiment applies to --kind experiment, costmap or healing only")
        if experiment is not None:
            from qkinspect.experiment.saved import read_experiment
            from qkinspect.report.experiment.costmap import costmap_figure
            from qkinspect.report.experiment.figure import experiment_figure
            from qkinspect.report.experiment.healing import healing_figure
            from qkinspect.report.style import style

            draw_runs = {Kind.costmap: costmap_figure, Kind.healing: healing_figure}.get(kind, experiment_figure)
            with style():
                save_figure(draw_runs(read_experiment(experiment), title=title), output)
            note(f"wrote the {kind.value} figure to {output}")
            return
        refuse_analysis_options(model, layers=layers, block=block, fold_ln=fold_ln, fold_qk_norm=fold_qk_norm,
                                precision=precision is not Precision.float32, device=device is not Device.cpu,
                                revision=revision)
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
        draw_figure(model, kind.value, output, sel, layer=layer, other=compare, metric=metric, revision=revision,
                    title=title)
        note(f"wrote the {metric or kind.value} figure to {output}")


TWIN_KINDS = (Kind.learning, Kind.gap, Kind.trajectory)


def draw_twin(model: str | None, kind: Kind, metric: str | None, output: Path, *, title: str | None = None) -> str:
    """A twin folder's figure (`qkinspect twin --out FOLDER`): learning (the default, also for --kind symmetry),
    gap or trajectory of `metric` (default symmetry), saved to `output`. Returns what was drawn."""
    from qkinspect.twin.saved import is_twin_folder, read_twin

    if not is_twin_folder(model):
        raise InputError(f"--kind {kind.value}: draws a twin folder (qkinspect twin --out FOLDER); "
                         f"{model or 'no folder given'} is not one (it has no twin.json)")
    kind = Kind.learning if kind is Kind.symmetry else kind
    if kind not in TWIN_KINDS:
        raise InputError(f"--kind {kind.value}: a twin folder draws --kind learning, gap or trajectory --metric "
                         "NAME")
    if metric is not None and kind is not Kind.trajectory:
        raise InputError(f"--metric applies to --kind trajectory only, not --kind {kind.value}")
    twin = read_twin(model)
    from qkinspect.report.titles import retitle
    from qkinspect.report.twin.figures import gap_figure, learning_figure, trajectory_figure  # matplotlib: last

    if kind is Kind.trajectory:
        metric = metric or "symmetry"
        fig = trajectory_figure(twin, metric)
    else:
        fig = (gap_figure if kind is Kind.gap else learning_figure)(twin)
    save_figure(retitle(fig, title), output)
    return f"{metric} trajectory" if kind is Kind.trajectory else kind.value


def draw_ladder(model: str | None, kind: Kind, output: Path, *, title: str | None = None) -> None:
    """A ladder folder's figure (`qkinspect twin --shapes ... --out FOLDER`): the scaling figure, saved to `output`
    (also the default, --kind symmetry); each shape's own figures are its folder's (FOLDER/LxD)."""
    from qkinspect.twin.ladder import is_ladder_folder, read_ladder

    if not is_ladder_folder(model):
        raise InputError(f"--kind {kind.value}: draws a ladder folder (qkinspect twin --shapes LxD,... --out FOLDER); "
                         f"{model or 'no folder given'} is not one (it has no ladder.json)")
    if kind not in (Kind.scaling, Kind.symmetry):
        raise InputError(f"--kind {kind.value}: a ladder folder draws --kind scaling; each shape's twin folder "
                         f"({Path(model) / 'LxD'}) draws learning, gap and trajectory")
    ladder = read_ladder(model)
    from qkinspect.report.titles import retitle
    from qkinspect.report.twin.scaling import scaling_figure  # matplotlib: last

    save_figure(retitle(scaling_figure(ladder), title), output)


def draw_heads(model: str | None, kind: Kind, metric: str | None, score: str | None, output: Path, *,
               title: str | None = None) -> str:
    """A heads document's figure (`qkinspect heads -o FILE.json`): `metric` against `score`, one dot per head
    (--kind heads, or the default kind), saved to `output`. Returns what was drawn."""
    from qkinspect.heads.saved import is_heads, read

    if not is_heads(model):
        raise InputError(f"--score: draws a heads document (qkinspect heads -o FILE.json); {model or 'no file given'} "
                         "is not one")
    if kind not in (Kind.heads, Kind.symmetry):
        raise InputError(f"--kind {kind.value}: a heads document draws --kind heads (--metric NAME --score NAME)")
    result = read(model)
    from qkinspect.report.heads.figures import check_pair, heads_figure  # matplotlib: after the checks

    metric, score = check_pair(result, metric, score)
    save_figure(heads_figure(result, metric, score, title=title), output)
    return f"{metric} / {score}"


def refuse_sweep_folder(model: str | None, kind: str) -> None:
    """InputError when `model` is a sweep folder (qkinspect sweep --out) and `kind` is not what it draws: it holds
    many checkpoints' results, drawn as --kind trajectory (one metric against training step)."""
    from qkinspect.sweep import is_sweep_folder, read_sweep

    if kind == Kind.trajectory.value or not is_sweep_folder(model):
        return
    try:
        sweep = read_sweep(Path(model))
        first = next((c.spec for c in sweep.checkpoints if c.identity in sweep.results), None)
        have = [k for k in (sweep.rows()[:1] or [{}])[0] if k not in ("checkpoint", "step", "block", "layer",
                                                                        "head", "kv_head")]
    except InputError:
        first, have = None, []
    have = [m for m in have if not m.startswith("rank_")]  # the numerical ranks kept are not metrics
    more = f", … {len(have) - 4} more" if len(have) > 4 else ""
    metrics = f" (e.g. {', '.join(have[:4])}{more})" if have else ""
    one = f" one checkpoint (e.g. {first})" if first else " one of its checkpoints"
    raise InputError(f"{model}: a sweep folder draws --kind trajectory --metric NAME{metrics}, each metric "
                     f"against training step; for --kind {kind}, give{one}, or `qkinspect report {model}` for "
                     "every figure of the sweep")


def check_figure_path(output: Path | None) -> Path:
    """The -o path, refused (InputError) when missing or not .png/.svg/.pdf, or when it cannot be written."""
    if output is None:
        raise InputError("plot writes a file: give -o FILE.png (or .svg, .pdf)")
    if output.suffix.lower() not in FIGURE_SUFFIXES:
        raise InputError(f"-o {output}: plot writes {', '.join(FIGURE_SUFFIXES)}; name the file with one of them")
    check_writable(output)
    return output


def draw_figure(model: str | None, kind: str, output: Path, selection: Selection, *, layer: int | None = None,
                other: str | None = None, metric: str | None = None, revision: str | None = None,
                title: str | None = None) -> None:
    """Analyse `model` (and `other` for compare), or read either from a saved analysis, draw the figure `kind`
    (titled `title`, default: the model's name and what is shown) and save it atomically to `output`.

    Example:
        >>> draw_figure(None, "symmetry", Path("symmetry.png"), Selection.parse())
    """
    from qkinspect.analysis.saved import is_saved
    from qkinspect.cli.options import check_selection
    from qkinspect.cli.run import run_analysis
    from qkinspect.loading import open_model

    if is_saved(model):
        result = result_of(model, selection, kind=kind)
    else:
        with open_model(model, revision=revision) as m:
            if layer is not None:  # answered with the option the user typed, before any work
                check_selection(m.info, selection.blocks, (layer,), options=("--layer", "--heads"))
            result = run_analysis(m, selection)
    result_b = result_of(other, selection, kind=kind) if other is not None else None
    from qkinspect.report.analysis.figures import figure  # matplotlib: after the checks, so that errors come fast
    # the heads figure takes the first selected block
    fig = figure(result, kind, layer=layer, other=result_b, metric_name=metric, title=title)
    save_figure(fig, output)


def draw_trajectory(folder: Path, metric: str, output: Path, *, layers: str | None = None,
                    blocks: list[str] | None = None, title: str | None = None) -> None:
    """The trajectory figure of a sweep folder's results (`qkinspect sweep --out FOLDER`), saved to `output`."""
    from qkinspect.cli.options import parse_blocks
    from qkinspect.report.sweep.trajectory import sweep_trajectory
    from qkinspect.selection import parse_indices
    from qkinspect.sweep import read_sweep

    fig = sweep_trajectory(read_sweep(folder), metric, layers=parse_indices(layers, "--layers"),
                           blocks=parse_blocks(blocks), title=title)
    save_figure(fig, output)


def draw_composition(model, output: Path, *, title: str | None = None, **options) -> None:
    """The composition figure (qkinspect.report.composition.figures) of a model or a saved `qkinspect composition
    -o c.json`, saved to `output`."""
    from qkinspect.cli.model_argument import composition_of
    from qkinspect.report.composition.figures import composition_figure
    from qkinspect.report.style import style

    result = composition_of(model, **options)
    with style():
        fig = composition_figure(result, title=title)
    save_figure(fig, output)


def draw_atlas(folder: Path, kind: Kind, metric: str | None, output: Path, *, title: str | None = None) -> str:
    """An atlas folder's figure (`qkinspect atlas --out FOLDER`): `depth` (the default, also for --kind symmetry)
    or `size`, of `metric` (default: symmetry; symmetry_layer for size when the atlas has it), saved to `output`.
    Returns what was drawn, e.g. "symmetry depth"."""
    from qkinspect.atlas.saved import read_atlas

    if kind not in (Kind.depth, Kind.size, Kind.symmetry):
        raise InputError(f"--kind {kind.value}: an atlas folder draws --kind depth or --kind size")
    atlas = read_atlas(folder)
    from qkinspect.report.atlas.figures import depth_figure, size_figure  # matplotlib: after the checks
    from qkinspect.report.titles import retitle

    if kind is Kind.size:
        metric = metric or ("symmetry_layer" if "symmetry_layer" in atlas.metrics else "symmetry")
        fig = size_figure(atlas, metric)
    else:
        metric = metric or "symmetry"
        fig = depth_figure(atlas, metric)
    save_figure(retitle(fig, title), output)
    return f"{metric} {'size' if kind is Kind.size else 'depth'}"


def save_figure(fig, output: Path) -> None:
    """Save a matplotlib Figure atomically; the format follows the file's extension."""
    from qkinspect.report.style import style

    fmt = output.suffix.lower().lstrip(".")
    with style():
        write_rendered(output, lambda buffer: fig.savefig(buffer, format=fmt))  # in memory: a full disk is OSError
