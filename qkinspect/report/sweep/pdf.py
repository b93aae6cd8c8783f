"""A sweep's report (docs/sweep.md), to the model report's standard: a cover naming the model and saying what was
swept and with what, in words; then one page per metric, its trajectory figure with a caption; every page with the
report's footer and its number. Built from the model report's pieces (report.pages, report.text, report.summary)."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import IO, Any

from qkinspect.report.style import human_name
from qkinspect.report.sweep.trajectory import raw_qk_norm_blocks_of, sweep_trajectory

# Drawn when the sweep computed them, in this order; otherwise its first per-head metrics.
METRICS = ("symmetry", "shared_qk_distance", "qk_effective_rank", "qk_stable_rank", "overlap_qk", "directionality")
NOT_METRICS = ("checkpoint", "step", "block", "layer", "head", "kv_head", "rank_q", "rank_k", "rank_v")
LISTED = 60  # checkpoints named on the cover


def sweep_metrics(sweep) -> list[str]:
    rows = sweep.rows()
    have = [k for k in (rows[0] if rows else {}) if k not in NOT_METRICS]
    return [m for m in METRICS if m in have] or have[:4]


def _last_result(sweep) -> dict[str, Any]:
    """The result document of the last checkpoint with one (its model and processing describe the sweep's)."""
    return next((sweep.results[c.identity].get("result") or {} for c in reversed(sweep.checkpoints)
                 if c.identity in sweep.results), {})


def sweep_name(sweep) -> str:
    """What the sweep's checkpoints are of, for titles: the model's name when every result gives the same one (hub
    revisions, a training callback's steps), else the folder the checkpoints share (`runs/bert/checkpoint-*`:
    `bert`, named as a model folder is), else the sweep folder's name."""
    names = {(doc.get("result") or {}).get("model", {}).get("name") for doc in sweep.results.values()}
    if len(names) == 1 and None not in names:
        return str(names.pop())
    specs = [c.spec for c in sweep.checkpoints]
    if specs and all(Path(s).is_absolute() or Path(s).exists() for s in specs):
        from qkinspect.loading.resolve import folder_name

        try:
            common = Path(os.path.commonpath([str(Path(s).resolve()) for s in specs]))
        except ValueError:  # different drives
            common = None
        if common is not None and common.parent != common:
            return folder_name(common if len(specs) > 1 else common.parent)
    return Path(sweep.folder).resolve().name or str(sweep.folder)


def _words(value: Any, none: str = "all") -> str:
    """An option's value as the report prints it: lists joined, flags yes/no, None as `none`."""
    if value is None:
        return none
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value)) or none
    return str(value)


def option_words(options: dict[str, Any]) -> list[tuple[str, str]]:
    """The sweep's analysis options as (name, words), in the order the sweep records them."""
    return [(k.replace("_", " "), _words(v)) for k, v in options.items()]


def _steps(sweep) -> str:
    steps = [c.step for c in sweep.checkpoints]
    return f"{min(steps)}-{max(steps)}" if steps else "none"


def _step_source(sweep) -> str:
    """Where the steps came from, in words."""
    words = {"order": "their order as given", "name": "read from their names",
             "trainer_state": "read from their trainer_state.json", "training": "measured during training"}
    source = {c.step_source for c in sweep.checkpoints}
    return words.get(source.pop(), "as recorded") if len(source) == 1 else "read from their names or trainer states"


def cover_lines(sweep, metrics: list[str], version: str, date: dt.datetime, name: str | None = None) \
        -> list[tuple[str, int]]:
    """The cover's lines (text, font size) of a sweep's report, as the HTML report shows them: what was swept, of
    which model, with what (no Python values: lists joined, flags yes/no)."""
    opts = "; ".join(f"{k} {v}" for k, v in option_words(sweep.options))
    return [
        ("qkinspect sweep report", 16),
        (f"model: {name or sweep_name(sweep)}", 10),
        (f"folder: {sweep.folder}", 10),
        (f"{len(sweep.checkpoints)} checkpoints, steps {_steps(sweep)}; {len(sweep.results)} with results, "
         f"{len(sweep.failures)} failed", 10),
        (f"options: {opts or 'defaults'}", 10),
        (f"figures: {', '.join(metrics)} against training step (per-layer median over heads; each head faint)", 10),
        (f"qkinspect {version}, {date:%Y-%m-%d %H:%M} UTC", 9),
    ]


def caption(sweep, metric: str) -> str:
    """The caption under `metric`'s trajectory: what is drawn, the metric's definition, the q/k-norm caveat where
    it concerns the metric."""
    from qkinspect.metrics.registry import METRICS as REGISTRY
    from qkinspect.report.analysis.figures import shows_raw_qk
    from qkinspect.report.analysis.summary import qk_norm_caveat_of

    ordered = {c.step_source for c in sweep.checkpoints} == {"order"}
    x = "the checkpoints in the order given" if ordered else "the training step"
    spec = REGISTRY.get(metric)
    define = f" {human_name(metric).capitalize()} ({metric}): {spec.description}." if spec is not None else ""
    rng = f" Range {spec.range}." if spec is not None and spec.range else ""
    caveat = qk_norm_caveat_of(raw_qk_norm_blocks_of(sweep)) if shows_raw_qk("metric", metric) else ""
    return (f"{human_name(metric).capitalize()} of every head against {x}, one panel per block. Thick lines: per "
            "layer, the median over its heads (colour: layer index); faint lines: each head, in its layer's "
            "colour. Dashed line and grey band: the random baseline (mean ± 3 standard deviations of the same "
            "metric for Gaussian weights of the same shapes), where the sweep measured one."
            f"{define}{rng}{' ' + caveat if caveat else ''}")


def write_sweep_pdf(sweep, target: str | Path | IO[bytes], *, date: dt.datetime | None = None,
                    title: str | None = None) -> int:
    """Write the report of a sweep folder (qkinspect.sweep.read_sweep) as a PDF; returns the number of pages.
    `title` names what was swept in the cover, footer and figure titles (default: the model, sweep_name)."""
    from qkinspect.report.pages import figure_page, report_pdf
    from qkinspect.version import __version__

    metrics = sweep_metrics(sweep)
    name = title or sweep_name(sweep)
    date = date or dt.datetime.now(dt.timezone.utc)
    intro = (f"How the query-key geometry of the attention heads changes across {len(sweep.checkpoints)} "
             "checkpoints, measured from their weights alone: each metric against the training step.")
    with report_pdf(target, version=__version__, report="sweep report", name=name, date=date, intro=intro,
                    subject="query-key geometry of attention heads across checkpoints") as pages:
        _cover(pages, sweep, metrics, __version__, date)
        figured = f"{name} ({len(sweep.results)} checkpoints)"
        for metric in metrics:
            figure_page(pages, lambda canvas, m=metric: sweep_trajectory(sweep, m, name=figured, canvas=canvas),
                        caption(sweep, metric))
    return pages.count


def _cover(pages, sweep, metrics: list[str], version: str, date: dt.datetime) -> None:
    """The cover's facts, under the title report_pdf sets: the model, the checkpoints, the options, the report."""
    from qkinspect.analysis.results import AnalysisResult
    from qkinspect.documents import model_info
    from qkinspect.layer import ModelInfo
    from qkinspect.processing import Processing
    from qkinspect.report.analysis.summary import qk_norm_notice_of
    from qkinspect.report.analysis.text import blocks_table
    from qkinspect.report.tables import Table

    model = _last_result(sweep).get("model") or {}
    pages.pairs([("model", sweep_name(sweep)), ("model type", str(model.get("model_type", "n/a"))),
                 ("architecture", str(model.get("architecture") or "n/a")),
                 ("format", str(model.get("format", "n/a"))), ("sweep folder", str(sweep.folder)),
                 ("checkpoints", f"{len(sweep.checkpoints)}, steps {_steps(sweep)} ({_step_source(sweep)})"),
                 ("results", f"{len(sweep.results)} with results, {len(sweep.failures)} failed")])
    if model.get("blocks"):
        info: ModelInfo = model_info(model)
        t = blocks_table(AnalysisResult(info, Processing(), [], []))
        pages.table(Table(t.title, t.header[:-1], [r[:-1] for r in t.rows]), min_column=0.7)
        pages.pairs([(f"{r[0]} flags", r[-1]) for r in t.rows])
    pages.heading("Analysis options", size=11)
    pages.pairs(option_words(sweep.options))
    if notice := qk_norm_notice_of(raw_qk_norm_blocks_of(sweep)):
        pages.paragraph(notice, color="#a00000")
    pages.heading("This report", size=11)
    pages.pairs([("tool", f"qkinspect {version}"), ("date", date.strftime("%Y-%m-%d %H:%M %Z").strip()),
                 ("figures", ", ".join(f"{human_name(m)} ({m})" for m in metrics) + ", against training step")])
    pages.heading("Checkpoints", size=11)
    pages.pairs([(f"step {c.step}", c.name + ("" if c.identity in sweep.results else "  (no result)"))
                 for c in sweep.checkpoints[:LISTED]], size=8, key_width=1.0)
    if len(sweep.checkpoints) > LISTED:
        pages.paragraph(f"… and {len(sweep.checkpoints) - LISTED} more (the sweep folder's sweep.json lists them "
                        "all).", size=8)
    for f in sweep.failures:
        pages.paragraph(f"failed: {f.name}: {f.error}", size=8, color="#a00000")
