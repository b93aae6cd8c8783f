"""Each capability's figures by `plot --kind`, drawn from what it saved: the `draw` functions the contract
(qkinspect.capabilities) names. Each takes the result, the kind and what `plot` was asked (`metric`, `title`, and
for an analysis the layer and the second model), checks what only the kind can check, and returns the Figure and
what was drawn, for the note ("the symmetry trajectory figure"). matplotlib is imported after the checks, so
errors come fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qkinspect.errors import InputError


def twin_figure(twin, kind: str, *, metric: str | None = None, title: str | None = None, **_: Any):
    """A twin folder's figure: learning, gap, or the trajectory of `metric` (default symmetry)."""
    if metric is not None and kind != "trajectory":
        raise InputError(f"--metric applies to --kind trajectory only, not --kind {kind}")
    from qkinspect.report.titles import retitle
    from qkinspect.report.twin.figures import gap_figure, learning_figure, trajectory_figure

    if kind == "trajectory":
        metric = metric or "symmetry"
        return retitle(trajectory_figure(twin, metric), title), f"{metric} trajectory figure"
    return retitle((gap_figure if kind == "gap" else learning_figure)(twin), title), f"{kind} figure"


def ladder_figure(ladder, kind: str, *, title: str | None = None, **_: Any):
    """A ladder folder's figure: each variant's gap against model size with its power-law fit."""
    from qkinspect.report.titles import retitle
    from qkinspect.report.twin.scaling import scaling_figure

    return retitle(scaling_figure(ladder), title), "scaling figure"


def heads_figure(result, kind: str, *, metric: str | None = None, score: str | None = None,
                 title: str | None = None, **_: Any):
    """A heads document's figure: `metric` against `score`, one dot per head (their defaults: check_pair's)."""
    from qkinspect.report.heads.figures import check_pair
    from qkinspect.report.heads.figures import heads_figure as draw

    metric, score = check_pair(result, metric, score)
    return draw(result, metric, score, title=title), f"{metric} / {score} figure"


def atlas_figure(atlas, kind: str, *, metric: str | None = None, title: str | None = None, **_: Any):
    """An atlas folder's figure: `depth` or `size` of `metric` (default: symmetry; symmetry_layer for size when
    the atlas has it)."""
    from qkinspect.report.atlas.figures import depth_figure, size_figure
    from qkinspect.report.titles import retitle

    if kind == "size":
        metric = metric or ("symmetry_layer" if "symmetry_layer" in atlas.metrics else "symmetry")
        return retitle(size_figure(atlas, metric), title), f"{metric} size figure"
    metric = metric or "symmetry"
    return retitle(depth_figure(atlas, metric), title), f"{metric} depth figure"


def sweep_figure(sweep, kind: str, *, metric: str | None = None, title: str | None = None,
                 layers: tuple[int, ...] | None = None, blocks: tuple[str, ...] | None = None, **_: Any):
    """A sweep folder's trajectory of `metric` (default symmetry) against training step."""
    from qkinspect.report.sweep.trajectory import sweep_trajectory

    metric = metric or "symmetry"
    return sweep_trajectory(sweep, metric, layers=layers, blocks=blocks, title=title), f"{metric} trajectory"


def composition_figure(result, kind: str, *, title: str | None = None, **_: Any):
    """Heads composing: the composition figure."""
    from qkinspect.report.composition.figures import composition_figure as draw
    from qkinspect.report.style import style

    with style():
        return draw(result, title=title), "composition figure"


def experiment_figure(result, kind: str, *, title: str | None = None, **_: Any):
    """An experiment document's figure: the runs (experiment), the estimated cost of every head (costmap), or
    healing."""
    from qkinspect.report.experiment.costmap import costmap_figure
    from qkinspect.report.experiment.figure import experiment_figure as runs_figure
    from qkinspect.report.experiment.healing import healing_figure
    from qkinspect.report.style import style

    draw = {"costmap": costmap_figure, "healing": healing_figure}.get(kind, runs_figure)
    with style():
        return draw(result, title=title), f"{kind} figure"


def analysis_figure(result, kind: str, *, metric: str | None = None, title: str | None = None,
                    layer: int | None = None, other=None, **_: Any):
    """An analysis's figure `kind` (qkinspect.report.analysis.figures)."""
    from qkinspect.report.analysis.figures import figure

    return figure(result, kind, layer=layer, other=other, metric_name=metric, title=title), f"{metric or kind} figure"


def refuse_sweep_kind(model: str | Path, kind: str) -> None:
    """InputError saying what a sweep folder draws (--kind trajectory --metric NAME, with metrics it has) and
    where `kind` can be drawn instead (one of its checkpoints, or its report)."""
    from qkinspect.sweep import read_sweep

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


def write_folder_report(cap, folder: Path, output: Path, *, html: bool = False, title: str | None = None) -> int:
    """The report of a folder `cap` saved (a sweep's, an atlas's, a twin's, a ladder's), written atomically as a
    PDF (returns the number of pages) or, with `html`, as one HTML page (returns 1).

    Raises:
        InputError: the folder cannot be read, or nothing in it has finished yet.
    """
    from qkinspect.files import atomic_write, write_rendered

    result = cap.get("read")(folder)
    if cap.filled and not getattr(result, cap.filled):
        raise InputError(cap.empty.format(folder=folder))
    if html:
        page = cap.get("html")(result, name=title)  # matplotlib: after the checks
        atomic_write(output, lambda f: f.write(page))
        return 1
    pdf = cap.get("pdf")
    return write_rendered(output, lambda buffer: pdf(result, buffer, title=title))
