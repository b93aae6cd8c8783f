"""`qkinspect compare`: per-head differences of the metrics between two checkpoints of one architecture
(a base model and its fine-tune, or two training steps). Differences are B − A."""

from __future__ import annotations

from typing import Annotated

import typer

from qkinspect.cli.options import (
    BlockOpt,
    Device,
    DeviceOpt,
    FoldLnOpt,
    FoldQkNormOpt,
    FormatOpt,
    HeadsOpt,
    LayersOpt,
    MetricsOpt,
    OutputOpt,
    Precision,
    PrecisionOpt,
)
from qkinspect.cli.output import Document, check_output, emit, progress
from qkinspect.documents import envelope

ModelA = Annotated[str, typer.Argument(help="The reference checkpoint (A).", show_default=False, metavar="MODEL_A")]
ModelB = Annotated[str, typer.Argument(help="The checkpoint compared with it (B); differences are B − A.",
                                       show_default=False, metavar="MODEL_B")]


def register(app: typer.Typer) -> None:
    @app.command()
    def compare(
        model_a: ModelA, model_b: ModelB, layers: LayersOpt = None, heads: HeadsOpt = None, block: BlockOpt = None,
        metrics: MetricsOpt = None, fold_ln: FoldLnOpt = False, fold_qk_norm: FoldQkNormOpt = False,
        precision: PrecisionOpt = Precision.float32, device: DeviceOpt = Device.cpu, fmt: FormatOpt = None,
        output: OutputOpt = None,
    ) -> None:
        """Per-head differences (B − A) of every metric for two checkpoints of the same architecture.

        Example: qkinspect compare ./bert-base ./bert-finetuned --metrics symmetry,overlap_qk -o diff.csv
        """
        from qkinspect.analysis.compare import compare as analyses
        from qkinspect.analysis.request import CLI_NAMES, check_request
        from qkinspect.cli.run import tell

        check_output(fmt, output)
        request = check_request(metrics, precision=precision, device=device, fold_ln=fold_ln,
                                fold_qk_norm=fold_qk_norm, names=CLI_NAMES, layers=layers, heads=heads, blocks=block)
        with progress("analysing heads") as p:
            a, b = analyses(model_a, model_b, request=request, progress=p)
        tell(a, request)
        tell(b, request)
        emit(compare_document(a, b, requested=request.requested), fmt, output)


def compare_document(a, b, *, requested=None) -> Document:
    from qkinspect.analysis.compare import common_metrics, head_deltas
    from qkinspect.documents import model_dict
    from qkinspect.terminal.analysis import default_columns
    from qkinspect.terminal.compare import render_compare

    rows = head_deltas(a, b)
    body = {"model_a": model_dict(a.model), "model_b": model_dict(b.model), "processing": a.processing,
            "metrics": common_metrics(a, b),
            "heads": rows, "warnings": [*a.warnings, *b.warnings]}
    cols = [f"delta_{m}" for m in default_columns(a, requested)]
    return Document(json=envelope("compare", **body), rows=rows,
                    render=lambda console: render_compare(console, a, b, rows, cols))
