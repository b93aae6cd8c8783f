"""`qkinspect twin`: the same small transformer trained from scratch, as standard and under each constraint."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from qkinspect.cli.options import Device, DeviceOpt, OutputOpt, RecordFormat
from qkinspect.cli.output import Document, check_output, check_parquet, emit, note, write_parquet


class Arch(str, Enum):
    llama = "llama"
    gpt2 = "gpt2"


class Init(str, Enum):
    draw = "draw"
    nearest = "nearest"


class Schedule(str, Enum):
    cosine = "cosine"
    constant = "constant"


class Rows(str, Enum):
    runs = "runs"
    trajectories = "trajectories"
    summary = "summary"
    lr = "lr"
    scaling = "scaling"


OutOpt = Annotated[Path, typer.Option(
    "--out", metavar="DIR", show_default=False,
    help="The twin folder: one file per run, written as each finishes; the same --out again skips those done.")]
VariantsOpt = Annotated[str, typer.Option(
    "--variants", metavar="V[,V…]",
    help="Constraints: share_qk, share_qk_reformer, symmetric, share_qkv, share_kv, rank:K, wq_identity, "
         "bilinear (standard is always trained).")]
MatchOpt = Annotated[bool, typer.Option(
    "--match-params", help="Also train each constrained variant with its MLP resized to the standard twin's "
                           "parameter count (within 1 %), as VARIANT+params.")]
ArchOpt = Annotated[Arch, typer.Option("--arch", help="transformers class: llama (RoPE, SwiGLU) or gpt2 (learned "
                                                      "absolute positions).")]
LayersOpt = Annotated[int, typer.Option("--layers", metavar="N", help="Transformer blocks.")]
DModelOpt = Annotated[int, typer.Option("--d-model", metavar="D", help="Residual width.")]
HeadsOpt = Annotated[int | None, typer.Option(
    "--heads", metavar="H", show_default=False,
    help="Attention heads per layer (default 4, or d_model / --head-size with --shapes or --head-size).")]
HeadSizeOpt = Annotated[int | None, typer.Option(
    "--head-size", metavar="D", show_default=False,
    help="Each head's size, kept across --shapes (default 32 there): heads = d_model / D.")]
ShapesOpt = Annotated[str | None, typer.Option(
    "--shapes", metavar="LxD[,LxD…]", show_default=False,
    help="A ladder of shapes, layers x d_model (2x64,4x128,6x192): every shape's twins in one folder, and a "
         "scaling fit of each variant's gap.")]
TokensPerParamOpt = Annotated[float | None, typer.Option(
    "--tokens-per-param", metavar="R", show_default=False,
    help="Each shape's steps set so that its training tokens are about R x its non-embedding parameters "
         "(instead of --steps).")]
ContextOpt = Annotated[int, typer.Option("--context", metavar="T", help="Tokens per training window.")]
ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", metavar="FILE", help="A transformers config.json (llama or gpt2) instead of the sizes above.")]
TextOpt = Annotated[Path | None, typer.Option(
    "--text", metavar="FILE|DIR", help="UTF-8 text, or every .txt of a folder; the last 10 % of each file is held "
                                       "out (default: Python's pydoc_data.topics, a demo).")]
TokenizerOpt = Annotated[str, typer.Option("--tokenizer", metavar="char|byte|bpe:N",
                                           help="Characters, bytes, or a BPE of N tokens trained on the training "
                                                "text.")]
SeedsOpt = Annotated[int, typer.Option("--seeds", metavar="N", help="Seeds 0..N-1 (initialisation and batch "
                                                                    "order).")]
LrOpt = Annotated[str, typer.Option("--lr", metavar="LR[,LR…]",
                                    help="Learning rate; with several, each variant's best on seed 0 is used.")]
StepsOpt = Annotated[int | None, typer.Option("--steps", metavar="N", show_default=False,
                                              help="Optimizer steps (default 2000), every shape's.")]
WarmupOpt = Annotated[int | None, typer.Option("--warmup", metavar="N",
                                               help="Warm-up steps (default: min(100, steps/10)).")]
InitOpt = Annotated[Init, typer.Option(
    "--init", help="A constrained twin's start: the standard draw itself put in the form (share_qk: W_K := W_Q), or "
                   "the nearest constrained form to the standard draw.")]
ScheduleOpt = Annotated[Schedule, typer.Option(
    "--schedule", help="After the warm-up: cosine to lr/10, or the learning rate held constant.")]
BatchOpt = Annotated[int, typer.Option("--batch", metavar="B", help="Windows per step.")]
EvalOpt = Annotated[int | None, typer.Option("--eval-every", metavar="N",
                                             help="Held-out loss every N steps (default: at the end).")]
EvalWindowsOpt = Annotated[int, typer.Option("--eval-windows", metavar="N",
                                             help="Fixed held-out windows evaluated (evenly spaced).")]
TrackOpt = Annotated[int | None, typer.Option("--track-every", metavar="N",
                                              help="Each head's symmetry and Q/K overlap every N steps.")]
MarginOpt = Annotated[float, typer.Option("--margin", metavar="NATS",
                                          help="Margin of the two one-sided tests on the held-out loss.")]
CheckpointsOpt = Annotated[bool, typer.Option(
    "--save-checkpoints", help="Each twin's final weights as a transformers folder under DIR/checkpoints/.")]
SchedulerOpt = Annotated[str | None, typer.Option(
    "--scheduler", metavar="ADDRESS", help="A running Dask scheduler (tcp://host:8786); default: a local cluster.")]
WorkersOpt = Annotated[int | None, typer.Option(
    "--workers", metavar="N", help="Local cluster: worker processes (default: one per core, at most one per run; "
                                   "0: in this process).")]
ThreadsOpt = Annotated[int | None, typer.Option(
    "--threads", metavar="N",
    help="torch threads a task (default: one per core for the CPU's default stacks in this process, else 1; 1 on "
         "a shared machine).")]
StackOpt = Annotated[int | None, typer.Option(
    "--stack", metavar="N", show_default=False,
    help="Train up to N runs of one shape together as one batched model (default: the runs shared evenly among "
         "the workers, as many a stack as fit in memory; 1: one run a task). Records equal the single runs'.")]


class Precision(str, Enum):
    float32 = "float32"
    bf16 = "bf16"


PrecisionOpt = Annotated[Precision, typer.Option(
    "--precision", help="float32, or bf16: bfloat16 autocast with float32 weights (a CPU or GPU with bfloat16).")]
CompileOpt = Annotated[bool, typer.Option("--compile", help="torch.compile the stacked model (where torch can).")]
FormatOpt = Annotated[RecordFormat | None, typer.Option(
    "--format", "-f", show_default=False, metavar="FORMAT",
    help="Output format; default: from -o's extension (.parquet too), else table on a terminal and json in a pipe.")]
RowsOpt = Annotated[Rows, typer.Option(
    "--rows", metavar="runs|trajectories|summary|lr|scaling",
    help="Which records csv, ndjson and parquet hold (JSON holds them all; scaling: a ladder's fits; summary: per "
         "shape).")]


def register(app: typer.Typer) -> None:
    @app.command()
    def twin(
        out: OutOpt, variants: VariantsOpt = "share_qk", match_params: MatchOpt = False, arch: ArchOpt = Arch.llama,
        layers: LayersOpt = 4, d_model: DModelOpt = 128, heads: HeadsOpt = None, context: ContextOpt = 64,
        config: ConfigOpt = None, text: TextOpt = None, tokenizer: TokenizerOpt = "char", seeds: SeedsOpt = 3,
        lr: LrOpt = "1e-3", steps: StepsOpt = None, warmup: WarmupOpt = None, schedule: ScheduleOpt = Schedule.cosine,
        init: InitOpt = Init.draw, batch: BatchOpt = 12,
        eval_every: EvalOpt = None, eval_windows: EvalWindowsOpt = 128, track_every: TrackOpt = None,
        margin: MarginOpt = 0.02, device: DeviceOpt = Device.cpu, save_checkpoints: CheckpointsOpt = False,
        scheduler: SchedulerOpt = None, workers: WorkersOpt = None, threads: ThreadsOpt = None,
        shapes: ShapesOpt = None, head_size: HeadSizeOpt = None, tokens_per_param: TokensPerParamOpt = None,
        stack: StackOpt = None, precision: PrecisionOpt = Precision.float32, compile: CompileOpt = False,
        fmt: FormatOpt = None, output: OutputOpt = None, rows: RowsOpt = Rows.runs,
    ) -> None:
        """Train the same small transformer from scratch, from the same seeds on the same text, as standard and
        under each constraint, and compare held-out losses paired by seed (docs/twin.md). Each run is written to
        --out DIR as it finishes; the same command again resumes. Failed runs are listed (exit 3).

        Example: qkinspect twin --out twin/ --variants share_qk,symmetric --seeds 2 --steps 300 --layers 2
        --d-model 64 --workers 0

        Example (nanoGPT's CPU scale, an lr sweep): qkinspect twin --out shakespeare/ --text shakespeare/
        --variants share_qk,share_qk_reformer,symmetric,share_qkv,bilinear --match-params --lr 3e-4,1e-3,3e-3
        --eval-every 250 -o runs.csv

        Example (a ladder of shapes, each trained on about 5 tokens per non-embedding parameter): qkinspect twin
        --out ladder/ --shapes 1x32,2x64,3x96 --head-size 16 --tokens-per-param 5 --variants share_qk,symmetric
        --rows scaling -o scaling.csv
        """
        fmt_name = fmt.value if fmt is not None else None
        parquet = check_parquet(fmt_name, output)
        if not parquet:
            check_output(fmt_name, output)
        from qkinspect.errors import InputError
        from qkinspect.twin.ladder import parse_shapes
        from qkinspect.twin.request import CLI_NAMES
        from qkinspect.twin.run import twin as run_twin

        if rows is Rows.scaling and (shapes is None or len(parse_shapes(shapes, CLI_NAMES)) < 2):
            raise InputError("--rows scaling: the scaling fit needs a ladder (--shapes with two shapes or more)")

        try:
            result = run_twin(out, variants=variants, match_params=match_params, arch=arch.value, layers=layers,
                              d_model=d_model, heads=heads, context=context, config=config, text=text,
                              tokenizer=tokenizer, seeds=seeds, lr=lr, steps=steps, warmup=warmup, batch=batch,
                              eval_every=eval_every, eval_windows=eval_windows, track_every=track_every,
                              margin=margin, device=device.value, save_checkpoints=save_checkpoints,
                              scheduler=scheduler, workers=workers, threads=threads, init=init.value,
                              schedule=schedule.value, shapes=shapes, head_size=head_size,
                              tokens_per_param=tokens_per_param, stack=stack, precision=precision.value,
                              compile=compile, notice=lambda line: note(f"twin: {line}"), names=CLI_NAMES)
        except KeyboardInterrupt:
            note(f"stopped; the runs done are kept in {out}: run the same command to resume")
            raise
        doc = Document(json=result.document(), rows=result.rows(rows.value), render=result.render_table)
        if not doc.rows and rows is Rows.trajectories and (parquet or output is not None or fmt is not None):
            note("twin: no trajectories to write: the runs were not tracked (--track-every N)")
        if parquet:
            write_parquet(doc.rows, output)
            shown = False
        else:
            shown = emit(doc, fmt_name, output) == "table" and (output is None or str(output) == "-")
        _on_stderr(result, shown)
        if result.failures:
            from qkinspect.errors import SweepFailed
            from qkinspect.terminal.twin import plural
            from qkinspect.twin.folder import MANIFEST

            raise SweepFailed(f"{plural(len(result.failures), 'run')} failed (listed above, and in "
                              f"{out / MANIFEST}); run the same command to retry them")


def _on_stderr(result, shown: bool) -> None:
    """The verdicts and notes on stderr where the table is not on stdout (-o FILE, JSON or CSV), so they reach the
    terminal whatever -o is; a learning rate chosen at the edge of its grid is a warning there in any case. A
    ladder: each shape's twin under its name, then the ladder's notes."""
    twins = getattr(result, "twins", None)
    if twins is None:
        _twin_on_stderr(result, shown, "")
        return
    for rung, twin in zip(result.rungs, twins, strict=True):
        _twin_on_stderr(twin, shown, f"{rung.name}: ")
    for n in result.notes if not shown else ():
        note(n)


def _twin_on_stderr(result, shown: bool, prefix: str) -> None:
    from qkinspect.cli.output import warn
    from qkinspect.terminal.twin import verdict_line
    from qkinspect.twin.summary import edge_notes

    edges = set(edge_notes({t.variant: t.lr for t in result.lr_sweep if t.chosen},
                           result.setup.get("plan", {}).get("lrs", [])))
    if not shown and (line := verdict_line(result.rows("summary"))) is not None:
        note(f"twin: {prefix}{line}")
    for n in result.notes:
        if n in edges:
            warn(prefix + n)
        elif not shown:
            note(prefix + n)
