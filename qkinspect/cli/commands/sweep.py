"""`qkinspect sweep`: `analyze` over many checkpoints, on Dask distributed, resumable (docs/sweep.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

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
from qkinspect.cli.options import (
    BlockOpt,
    By,
    ByOpt,
    Device,
    DeviceOpt,
    FoldLnOpt,
    FoldQkNormOpt,
    HeadsOpt,
    LayerFormOpt,
    LayersOpt,
    MetricsOpt,
    OutputOpt,
    Precision,
    PrecisionOpt,
)
from qkinspect.cli.output import QUIET, Document, note, warn
from qkinspect.errors import SweepFailed

SpecsArg = Annotated[list[str], typer.Argument(
    help="Checkpoints: folders, weight files, globs (quote them: 'runs/*/checkpoint-*'), hub ids.",
    show_default=False, metavar="SPEC")]
OutDirOpt = Annotated[Path, typer.Option(
    "--out", metavar="DIR", show_default=False,
    help="The sweep folder: one result file per checkpoint, written as each finishes; a re-run skips those done.")]
RevisionsOpt = Annotated[str | None, typer.Option(
    "--revisions", metavar="R1,R2,...", help="Hub revisions: each hub id SPEC becomes one checkpoint per revision.")]


def register(app: typer.Typer) -> None:
    @app.command()
    def sweep(
        specs: SpecsArg, out: OutDirOpt, revisions: RevisionsOpt = None, scheduler: SchedulerOpt = None,
        workers: WorkersOpt = None, threads: ThreadsOpt = None, layers: LayersOpt = None, heads: HeadsOpt = None,
        block: BlockOpt = None, metrics: MetricsOpt = None, by: ByOpt = By.head, fold_ln: FoldLnOpt = False,
        fold_qk_norm: FoldQkNormOpt = False, layer_form: LayerFormOpt = False,
        precision: PrecisionOpt = Precision.float32, device: DeviceOpt = Device.cpu, fmt: RecordFormatOpt = None,
        output: OutputOpt = None,
    ) -> None:
        """Analyse many checkpoints of one shape (training steps, hub revisions, fine-tunes of one base) on Dask
        distributed: a local cluster by default, or a running one with --scheduler. Each checkpoint's result is
        written to --out DIR as it finishes; running the same command again skips what is done. The table has a
        row per checkpoint, step, block, layer and head (per layer with --by layer), as analyze's; failed
        checkpoints are listed at the end (exit 3).

        Example: qkinspect sweep 'runs/*/checkpoint-*' --metrics symmetry --out sweep/ -o symmetry.parquet

        Example (Pythia's published steps): qkinspect sweep EleutherAI/pythia-160m --revisions step1000,step2000
        --out pythia/ --scheduler tcp://head-node:8786 -o pythia.csv
        """
        from qkinspect.analysis.request import check_model
        from qkinspect.sweep import discover
        from qkinspect.sweep.engine import run
        from qkinspect.sweep.names import CLI_NAMES
        from qkinspect.sweep.request import check_request

        name = engine_format("sweep", fmt, output)
        # the engine's options, then the analysis's, checked once, in the CLI's names, before any work
        request = check_request(out, {"metrics": metrics, "precision": precision, "fold_ln": fold_ln,
                                      "fold_qk_norm": fold_qk_norm, "layer_form": layer_form, "layers": layers,
                                      "heads": heads, "blocks": block}, scheduler=scheduler, workers=workers,
                                threads=threads, device=device, names=CLI_NAMES)
        checkpoints = discover(specs, [r.strip() for r in revisions.split(",")] if revisions else None,
                               CLI_NAMES.revisions)
        try:
            # what analyze would refuse for every checkpoint (the selection, the q/k-norm fold), refused once for the
            # sweep before any analysis
            outcome = run(request, checkpoints, progress=None if QUIET["on"] else ProgressLine(),
                          check=lambda info: check_model(request.analysis, info),
                          notice=lambda why: note(f"{why}; computing it again"))
        except KeyboardInterrupt:
            note(f"stopped; the checkpoints done are kept in {out}: run the same command to resume")
            raise
        folder = outcome.read()
        note(f"{len(outcome.computed)} computed, {len(outcome.skipped)} already in {out}, "
             f"{len(outcome.failures)} failed; {steps_line(checkpoints)}")
        write_table(sweep_document(folder, by=by.value, requested=request.analysis.requested), name, output)
        for f in outcome.failures:
            warn(f"failed: {f.name}: {f.error}")
        if outcome.failures:
            raise SweepFailed(f"{len(outcome.failures)} of {len(checkpoints)} checkpoints failed (listed above, and "
                              f"in {out / 'sweep.json'}); run the same command to retry them")


def steps_line(checkpoints) -> str:
    """Where the steps came from, e.g. "steps 500-3000 read from their names"."""
    steps = [c.step for c in checkpoints]
    sources = {c.step_source for c in checkpoints}
    if sources == {"order"}:
        how = "their order (not every checkpoint has a trainer_state.json global_step or a step in its name)"
    else:
        how = " and ".join(w for s, w in (("trainer_state", "trainer_state.json"), ("name", "their names"))
                           if s in sources)
    return f"steps {min(steps)}-{max(steps)} read from {how}"


def sweep_document(folder, *, by: str = "head", requested=None) -> Document:
    """JSON: the envelope with the sweep's options, checkpoints, failures and the rows (as "heads" or "layers");
    rows: the tidy table."""
    doc = folder.document(by=by)
    rows = doc["heads" if by == "head" else "layers"]
    return Document(json=doc, rows=rows,
                    render=lambda console: _render(console, rows, requested, by))


def _render(console, rows: list[dict[str, Any]], requested, by: str = "head") -> None:
    from qkinspect.terminal.sweep import render_sweep

    render_sweep(console, rows, requested, by)
