"""`qkinspect atlas`: many models of any family and shape, on normalised depth, on the sweep's engine
(docs/atlas.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from qkinspect.cli.commands.sweep import (
    ProgressLine,
    SchedulerOpt,
    SweepFormatOpt,
    ThreadsOpt,
    WorkersOpt,
    check_engine_options,
    write_table,
)
from qkinspect.cli.options import Device as DeviceChoice
from qkinspect.cli.options import (
    DeviceOpt,
    FoldLnOpt,
    MetricsOpt,
    OutputOpt,
    Precision,
    PrecisionOpt,
    Selection,
)
from qkinspect.cli.output import Document, note, warn
from qkinspect.errors import SweepFailed

ModelsArg = Annotated[list[str] | None, typer.Argument(
    help="Models: folders, weight files, GGUF files, hub ids (the local cache when offline), globs, and saved "
         "analyses (qkinspect analyze -o run.json, taken as they are).", show_default=False, metavar="MODEL")]
AtlasOutOpt = Annotated[Path, typer.Option(
    "--out", metavar="DIR", show_default=False,
    help="The atlas folder: each model's analysis written as it finishes; a re-run skips those done.")]
FromOpt = Annotated[Path | None, typer.Option(
    "--from", metavar="FILE", help="A file naming the models, one a line (# starts a comment).")]
HfCacheOpt = Annotated[bool, typer.Option(
    "--hf-cache", help="Every model the local Hugging Face cache holds (HF_HUB_CACHE or HF_HOME), by repo id.")]

POSITIONAL = {"absolute": "abs", "relative": "rel"}
# The table answers the seeds' questions (symmetry, Q/K/V similarity); every metric is in the records.
TABLE_METRICS = ("symmetry", "symmetry_layer", "overlap_qk", "overlap_qv", "overlap_kv")


def register(app: typer.Typer) -> None:
    @app.command()
    def atlas(
        models: ModelsArg = None, out: AtlasOutOpt = ..., from_file: FromOpt = None, hf_cache: HfCacheOpt = False,
        metrics: MetricsOpt = None, fold_ln: FoldLnOpt = False, precision: PrecisionOpt = Precision.float32,
        device: DeviceOpt = DeviceChoice.cpu, scheduler: SchedulerOpt = None, workers: WorkersOpt = None,
        threads: ThreadsOpt = None, fmt: SweepFormatOpt = None, output: OutputOpt = None,
    ) -> None:
        """Compare many models of any family, shape and format: per model and block (an encoder-decoder has
        three), each metric's median and quartiles over heads, the layer form (Σ_h W_Q W_Kᵀ with query head h
        reading key head h // (heads/kv heads)), and per layer the median over heads at normalised depth
        l/(L-1), beside the model's facts. Runs on Dask as sweep does (a local cluster, or --scheduler); each
        model's analysis is written to --out DIR as it finishes, and a re-run skips those done. The table has a
        row per model and block; -o FILE writes the tidy records (model, block, metric, scope, layer, depth,
        median, q1, q3, n). Failed models are listed at the end (exit 3). plot DIR and report DIR draw it.

        Example: qkinspect atlas $DEMO SmolLM2-135M-Instruct.Q4_1.gguf --out atlas/ -o atlas.csv

        Example (every model in the local Hugging Face cache, on a cluster): qkinspect atlas --hf-cache --out
        atlas/ --scheduler tcp://head-node:8786 -o atlas.parquet

        Example (a saved analysis among the models): qkinspect analyze ./my-bert --layer-form -o bert.json;
        qkinspect atlas bert.json ./my-gpt2 --out atlas/
        """
        from qkinspect.sweep.names import CLI_NAMES
        from qkinspect.zoo.inputs import entries
        from qkinspect.zoo.run import atlas_options, run_atlas

        name = check_engine_options("atlas", fmt, output, threads, workers, scheduler)
        sel = Selection.parse(metrics=metrics, precision=precision, device=device, fold_ln=fold_ln)
        options = {"metrics": sel.metrics, "precision": sel.precision, "fold_ln": sel.fold_ln}
        atlas_options(options)  # refused before the models are looked for
        items = entries(models or [], from_file=from_file, hf_cache=hf_cache, names=CLI_NAMES)
        try:
            outcome = run_atlas(items, options, out, scheduler=scheduler, workers=workers, threads=threads,
                                device=sel.device, progress=ProgressLine("atlas"),
                                notice=lambda why: note(f"{why}; computing it again"), names=CLI_NAMES)
        except KeyboardInterrupt:
            note(f"stopped; the models done are kept in {out}: run the same command to resume")
            raise
        result = outcome.read()
        note(f"{len(outcome.computed)} computed, {len(outcome.skipped)} already in {out}, {len(outcome.saved)} "
             f"saved analyses, {len(outcome.failures)} failed")
        for line in result.notes:
            note(line)
        write_table(atlas_document(result), name, output)
        for f in outcome.failures:
            warn(f"failed: {f.name}: {f.error}")
        if outcome.failures:
            raise SweepFailed(f"{len(outcome.failures)} of {len(items)} models failed (listed above, and in "
                              f"{out / 'atlas.json'}); run the same command to retry them")


def atlas_document(result) -> Document:
    """JSON: the envelope with the atlas (folder, options, models, facts, records, notes, failures); rows: the tidy
    records; the table: a row per model and block."""
    return Document(json=result.document(), rows=result.records,
                    render=lambda console: render_atlas(console, result))


def render_atlas(console, result) -> None:
    from qkinspect.terminal.tables import print_lines

    tables, lines = atlas_tables(result.rows(), width=console.width)
    for t in tables:
        console.print(t)
    print_lines(console, lines)


def atlas_tables(rows: list[dict[str, Any]], *, width: int = 80) -> tuple[list, list[str]]:
    """A row per model and block: its layers, heads, positions and attention parameters, then the medians of the
    seeds' metrics (d_model, d_head and the rest are in the records and facts); model names wider than a quarter of
    `width` are numbered, the numbers spelt out in the returned lines (with the legend)."""
    from qkinspect.terminal.tables import Column, fit_tables, fmt_value, legend, short_name

    names = list(dict.fromkeys(r["model"] for r in rows))
    numbered = max(map(len, names), default=0) > width // 4
    ids = {n: str(i + 1) for i, n in enumerate(names)}
    labels = [Column("#" if numbered else "model", [ids[r["model"]] if numbered else r["model"] for r in rows],
                     left=not numbered),
              Column("block", [r["block"] for r in rows], left=True)]
    values = [Column("L", [str(r["layers"]) for r in rows]),
              Column("H:kv", [f"{r['heads']}:{r['kv_heads']}" for r in rows]),
              Column("pos", [POSITIONAL.get(r["positional"], str(r["positional"])) for r in rows], left=True),
              Column("params", [_count(r["attention_params"]) for r in rows])]
    shown = [m for m in TABLE_METRICS if any(r.get(m) is not None for r in rows)]
    values += [Column(short_name(m), [fmt_value(r.get(m)) for r in rows]) for m in shown]
    several = len(rows) > len(names)  # a model of several blocks: a rule between models
    sections = [i for i in range(1, len(rows)) if several and rows[i]["model"] != rows[i - 1]["model"]]
    lines = [
        "medians over each block's heads (sym_sum: the layer form's, over layers); L layers, H:kv query and "
        "key/value heads, params attention weights; widths, quartiles and per-layer medians: -o FILE",
        legend(shown)]
    if numbered:
        lines.append("models: " + ", ".join(f"{ids[n]}={n}" for n in names))
    return fit_tables(labels, values, width=width, sections=sections), lines


def _count(n: int) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)
