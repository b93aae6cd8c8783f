"""`qkinspect atlas`: many models of any family and shape, on normalised depth, on the sweep's engine
(docs/atlas.md). Option declarations, the CLI's names, one library call (`qkinspect.atlas.run.build_atlas`) and the
output; the table is `qkinspect.terminal.atlas`'s."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qkinspect.cli.engine_options import (
    ProgressLine,
    RecordFormatOpt,
    SchedulerOpt,
    ThreadsOpt,
    WorkersOpt,
    engine_format,
    write_table,
)
from qkinspect.cli.options import Device as DeviceChoice
from qkinspect.cli.options import DeviceOpt, FoldLnOpt, MetricsOpt, OutputOpt, Precision, PrecisionOpt
from qkinspect.cli.output import Document, note, warn
from qkinspect.errors import SweepFailed
from qkinspect.terminal.atlas import render_atlas

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
BehaviourOpt = Annotated[bool, typer.Option(
    "--behaviour", help="Also run heads in each model's task: its behaviour scores (previous_token, induction, "
                        "duplicate_token, self, first_token, entropy) join the per-head metrics, and the rank "
                        "correlations of symmetry, overlap_qk and qk_effective_rank with each score are kept per "
                        "model (--relations shows them).")]
SequencesOpt = Annotated[int | None, typer.Option(
    "--sequences", metavar="N", show_default=False,
    help="With --behaviour: repeated random sequences for induction and duplicate-token [default: 16].")]
LengthOpt = Annotated[int | None, typer.Option(
    "--length", metavar="T", show_default=False,
    help="With --behaviour: random tokens per sequence, before its repeat [default: 32].")]
SeedOpt = Annotated[int | None, typer.Option(
    "--seed", metavar="S", show_default=False, help="With --behaviour: seed of the random tokens [default: 0].")]
RelationsOpt = Annotated[bool, typer.Option(
    "--relations", help="The table and the rows (-o FILE.csv) are the relations across models (model, block, "
                        "metric, score, scope, rho, low, high, p, n), not the records.")]


def register(app: typer.Typer) -> None:
    @app.command()
    def atlas(
        models: ModelsArg = None, out: AtlasOutOpt = ..., from_file: FromOpt = None, hf_cache: HfCacheOpt = False,
        metrics: MetricsOpt = None, fold_ln: FoldLnOpt = False, fold_qk_norm: AtlasFoldQkNormOpt = False,
        precision: PrecisionOpt = Precision.float32, device: DeviceOpt = DeviceChoice.cpu,
        scheduler: SchedulerOpt = None, workers: WorkersOpt = None, threads: ThreadsOpt = None,
        fmt: RecordFormatOpt = None, output: OutputOpt = None, vs_chance: VsChanceOpt = False,
        behaviour: BehaviourOpt = False, sequences: SequencesOpt = None, length: LengthOpt = None,
        seed: SeedOpt = None, relations: RelationsOpt = False,
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

        Example (behaviour beside the weights, the relations across models): qkinspect atlas $DEMO
        SmolLM2-135M-Instruct.Q4_1.gguf --out atlas/ --behaviour --relations
        """
        from qkinspect.atlas.run import build_atlas
        from qkinspect.sweep.names import CLI_NAMES

        name = engine_format("atlas", fmt, output)
        try:
            outcome = build_atlas(models or [], out=out, from_file=from_file, hf_cache=hf_cache, metrics=metrics,
                                  precision=precision.value, fold_ln=fold_ln, fold_qk_norm=fold_qk_norm,
                                  device=device.value, scheduler=scheduler, workers=workers, threads=threads,
                                  progress=ProgressLine("atlas"), notice=lambda why: note(f"{why}; computing it again"),
                                  behaviour=behaviour, sequences=sequences, length=length, seed=seed,
                                  names=CLI_NAMES)
        except KeyboardInterrupt:
            note(f"stopped; the models done are kept in {out}: run the same command to resume")
            raise
        result = outcome.read()
        note(f"{len(outcome.computed)} computed, {len(outcome.skipped)} already in {out}, {len(outcome.saved)} "
             f"saved analyses, {len(outcome.failures)} failed")
        for line in result.notes:
            note(line)
        write_table(atlas_document(result, vs_chance=vs_chance, relations=relations), name, output)
        for f in outcome.failures:
            warn(f"failed: {f.name}: {f.error}")
        if outcome.failures:
            raise SweepFailed(f"{len(outcome.failures)} of {len(outcome.entries)} models failed (listed above, and in "
                              f"{out / 'atlas.json'}); run the same command to retry them")


def atlas_document(result, *, vs_chance: bool = False, relations: bool = False) -> Document:
    """JSON: the envelope with the atlas (folder, options, models, facts, records, notes, failures; relations with
    behaviour scores); rows: the tidy records; the table: a row per model and block. With `relations`, the rows
    and the table are the relations across models."""
    if relations:
        from qkinspect.terminal.atlas import render_relations

        return Document(json=result.document(), rows=result.relation_rows(),
                        render=lambda console: render_relations(console, result))
    return Document(json=result.document(), rows=result.table_rows(),
                    render=lambda console: render_atlas(console, result, vs_chance=vs_chance))
