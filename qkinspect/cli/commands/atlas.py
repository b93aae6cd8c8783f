"""`qkinspect atlas`: many models of any family and shape, on normalised depth, on the sweep's engine
(docs/atlas.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from qkinspect.cli.engine_options import (
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
AtlasFoldQkNormOpt = Annotated[bool, typer.Option(
    "--fold-qk-norm",
    help="Fold the per-head q/k-norm gains (Qwen3, OLMo2, Gemma3) into W_Q and W_K of each model that has them, "
         "so that its form is W_Q diag(γ_q γ_k) W_Kᵀ, what attention computes; the other models are measured as "
         "stored. Without it those models are measured raw, and flagged.")]
VsChanceOpt = Annotated[bool, typer.Option(
    "--vs-chance", help="The table's overlaps as ratios to their chance level (1 = what random weights of the "
                        "model's shapes give); the records always hold both (chance, vs_chance).")]

POSITIONAL = {"absolute": "abs", "relative": "rel"}
# The table answers the seeds' questions (symmetry, Q/K/V similarity); every metric is in the records.
TABLE_METRICS = ("symmetry", "symmetry_layer", "overlap_qk", "overlap_qv", "overlap_kv")


def register(app: typer.Typer) -> None:
    @app.command()
    def atlas(
        models: ModelsArg = None, out: AtlasOutOpt = ..., from_file: FromOpt = None, hf_cache: HfCacheOpt = False,
        metrics: MetricsOpt = None, fold_ln: FoldLnOpt = False, fold_qk_norm: AtlasFoldQkNormOpt = False,
        precision: PrecisionOpt = Precision.float32, device: DeviceOpt = DeviceChoice.cpu,
        scheduler: SchedulerOpt = None, workers: WorkersOpt = None, threads: ThreadsOpt = None,
        fmt: SweepFormatOpt = None, output: OutputOpt = None, vs_chance: VsChanceOpt = False,
    ) -> None:
        """Compare many models of any family, shape and format: per model and block (an encoder-decoder has
        three), each metric's median and quartiles over heads, the layer form (Σ_h W_Q W_Kᵀ with query head h
        reading key head h // (heads/kv heads)), and per layer the median over heads at normalised depth
        l/(L-1), beside the model's facts. Runs on Dask as sweep does (a local cluster, or --scheduler); each
        model's analysis is written to --out DIR as it finishes, and a re-run skips those done. The table has a
        row per model and block, the overlaps beside their chance level (random weights of the model's
        shapes); -o FILE writes the tidy records (model, block, metric, scope, layer, depth, median, q1, q3, n,
        chance, vs_chance, path). Models are named as info names them. Models with q/k norms (Gemma-3, Qwen3,
        OLMo2) are measured raw and flagged unless --fold-qk-norm. Failed models are listed at the end
        (exit 3). plot DIR and report DIR draw it.

        Example: qkinspect atlas $DEMO SmolLM2-135M-Instruct.Q4_1.gguf --out atlas/ -o atlas.csv

        Example (every model in the local Hugging Face cache, on a cluster): qkinspect atlas --hf-cache --out
        atlas/ --scheduler tcp://head-node:8786 -o atlas.parquet

        Example (q/k norms folded, overlaps as ratios to chance): qkinspect atlas gemma-3-270m.gguf $DEMO
        --out atlas/ --fold-qk-norm --vs-chance

        Example (a saved analysis among the models): qkinspect analyze ./my-bert --layer-form -o bert.json;
        qkinspect atlas bert.json ./my-gpt2 --out atlas/
        """
        from qkinspect.sweep.names import CLI_NAMES
        from qkinspect.zoo.inputs import entries
        from qkinspect.zoo.run import atlas_options, run_atlas

        name = check_engine_options("atlas", fmt, output, threads, workers, scheduler)
        sel = Selection.parse(metrics=metrics, precision=precision, device=device, fold_ln=fold_ln)
        options = {"metrics": sel.metrics, "precision": sel.precision, "fold_ln": sel.fold_ln,
                   "fold_qk_norm": fold_qk_norm}
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
        write_table(atlas_document(result, vs_chance=vs_chance), name, output)
        for f in outcome.failures:
            warn(f"failed: {f.name}: {f.error}")
        if outcome.failures:
            raise SweepFailed(f"{len(outcome.failures)} of {len(items)} models failed (listed above, and in "
                              f"{out / 'atlas.json'}); run the same command to retry them")


def atlas_document(result, *, vs_chance: bool = False) -> Document:
    """JSON: the envelope with the atlas (folder, options, models, facts, records, notes, failures); rows: the tidy
    records; the table: a row per model and block."""
    return Document(json=result.document(), rows=result.records,
                    render=lambda console: render_atlas(console, result, vs_chance=vs_chance))


def render_atlas(console, result, *, vs_chance: bool = False) -> None:
    from qkinspect.terminal.tables import print_lines

    tables, lines = atlas_tables(result.rows(), width=console.width, vs_chance=vs_chance)
    for t in tables:
        console.print(t)
    print_lines(console, lines)


def atlas_tables(rows: list[dict[str, Any]], *, width: int = 80, vs_chance: bool = False) -> tuple[list, list[str]]:
    """A row per model and block: its layers, heads, positions and attention parameters, then the medians of the
    seeds' metrics with the overlaps' chance level (d_model, d_head and the rest are in the records and facts; with
    `vs_chance` the overlaps are ratios to it); a block with q/k norms measured raw is marked `*`; model names wider
    than a quarter of `width` are numbered, the numbers spelt out in the returned lines (with the legend)."""
    from qkinspect.terminal.tables import Column, fit_tables, fmt_value, legend, short_name

    names = list(dict.fromkeys(r["model"] for r in rows))
    numbered = max(map(len, names), default=0) > width // 4
    ids = {n: str(i + 1) for i, n in enumerate(names)}
    labels = [Column("#" if numbered else "model", [ids[r["model"]] if numbered else r["model"] for r in rows],
                     left=not numbered),
              Column("block", [r["block"] + ("*" if r.get("qk_norm_raw") else "") for r in rows], left=True)]
    values = [Column("L", [str(r["layers"]) for r in rows]),
              Column("H:kv", [f"{r['heads']}:{r['kv_heads']}" for r in rows]),
              Column("pos", [POSITIONAL.get(r["positional"], str(r["positional"])) for r in rows], left=True),
              Column("params", [_count(r["attention_params"]) for r in rows])]
    shown = [m for m in TABLE_METRICS if any(r.get(m) is not None for r in rows)]
    overlaps = [m for m in shown if m.startswith("overlap_")]
    for m in shown:
        cells = [fmt_value(_over(r.get(m), r.get(f"{m}_chance")) if vs_chance and m in overlaps else r.get(m))
                 for r in rows]
        values.append(Column(short_name(m) + ("/ch" if vs_chance and m in overlaps else ""), cells))
    chance = next((f"{m}_chance" for m in overlaps if any(r.get(f"{m}_chance") is not None for r in rows)), None)
    if chance:
        values.append(Column("chance", [fmt_value(r.get(chance)) for r in rows]))
    several = len(rows) > len(names)  # a model of several blocks: a rule between models
    sections = [i for i in range(1, len(rows)) if several and rows[i]["model"] != rows[i - 1]["model"]]
    lines = [
        "medians over each block's heads (sym_sum: the layer form's, over layers); L layers, H:kv query and "
        "key/value heads, params attention weights; widths, quartiles and per-layer medians: -o FILE",
        legend(shown)]
    if chance:
        lines.append("chance: the Q/K overlap of random weights of the block's shapes (≈ d_head / d_model), the "
                     "level an overlap is read against; " + ("ovl_*/ch: each overlap over its own chance level"
                                                             if vs_chance else "--vs-chance shows the overlaps as "
                                                             "ratios to it") + "; every chance level: -o FILE")
    if any(r.get("qk_norm_raw") for r in rows):
        lines.append("* q/k norms not folded: measured raw (the stored projections' W_Q W_Kᵀ), not what attention "
                     "computes; --fold-qk-norm folds the gains")
    if numbered:
        lines.append("models: " + ", ".join(f"{ids[n]}={n}" for n in names))
    return fit_tables(labels, values, width=width, sections=sections), lines


def _over(value: float | None, chance: float | None) -> float | None:
    return value / chance if value is not None and chance else None


def _count(n: int) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)
