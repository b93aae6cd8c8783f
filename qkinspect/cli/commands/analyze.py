"""`qkinspect analyze`: per-head metrics of W_Q W_Kᵀ (symmetry, spectra, ranks) and Q/K/V similarity."""

from __future__ import annotations

from typing import Annotated

import typer

from qkinspect.cli.options import (
    BlockOpt,
    By,
    ByOpt,
    Device,
    DeviceOpt,
    FoldLnOpt,
    FoldQkNormOpt,
    FormatOpt,
    HeadsOpt,
    LayerFormOpt,
    LayersOpt,
    MetricsOpt,
    ModelArg,
    OutputOpt,
    Precision,
    PrecisionOpt,
    RevisionOpt,
)
from qkinspect.cli.output import Document, check_output, emit

SortOpt = Annotated[str | None, typer.Option("--sort", metavar="METRIC", help="Sort rows by METRIC, largest first.")]
AscendingOpt = Annotated[bool, typer.Option("--ascending", help="With --sort: smallest first.")]
TopOpt = Annotated[int | None, typer.Option("--top", metavar="N", help="Keep the first N rows (after --sort).")]


def register(app: typer.Typer) -> None:
    @app.command()
    def analyze(
        model: ModelArg = None, layers: LayersOpt = None, heads: HeadsOpt = None, block: BlockOpt = None,
        metrics: MetricsOpt = None, by: ByOpt = By.head, sort: SortOpt = None, ascending: AscendingOpt = False,
        top: TopOpt = None, fold_ln: FoldLnOpt = False, fold_qk_norm: FoldQkNormOpt = False,
        layer_form: LayerFormOpt = False, precision: PrecisionOpt = Precision.float32, device: DeviceOpt = Device.cpu,
        revision: RevisionOpt = None, fmt: FormatOpt = None, output: OutputOpt = None,
    ) -> None:
        """Measure every attention head: symmetry and spectrum of W_Q W_Kᵀ, effective rank, Q/K/V overlap,
        with a random baseline and a per-layer summary.

        Example: qkinspect analyze ./my-bert --layers 0-3 --metrics symmetry,overlap_qk --sort symmetry --top 10

        Example (a model with q/k norms: Qwen3, OLMo2, Gemma3): qkinspect analyze ./my-qwen3 --fold-ln --fold-qk-norm

        Example (how far is each head from sharing one query/key matrix?): qkinspect analyze ./my-bert --metrics
        symmetry,shared_qk_distance --sort shared_qk_distance --ascending
        """
        from qkinspect.analysis.request import CLI_NAMES, check_request
        from qkinspect.cli.run import run_analysis, sort_and_trim

        check_output(fmt, output)
        request = check_request(metrics, precision=precision, device=device, fold_ln=fold_ln,
                                fold_qk_norm=fold_qk_norm, layer_form=layer_form, names=CLI_NAMES, layers=layers,
                                heads=heads, blocks=block)
        request.check_sort(sort, top, by.value)
        result = run_analysis(model, request, revision=revision)
        result = sort_and_trim(result, sort=sort, top=top, by=by.value, ascending=ascending)
        emit(analysis_document(result, by=by.value, requested=request.requested, sort=sort), fmt, output)


def analysis_document(result, *, by: str = "head", requested=None, sort: str | None = None) -> Document:
    """JSON: the result's schema-qkinspect/1 dict (with "kind": "analyze"); rows: tidy per head (or per layer)."""
    from qkinspect.terminal.analysis import default_columns, render_analysis

    cols = default_columns(result, requested, sort)
    return Document(json=result.document(), rows=result.table_rows(by),  # what AnalysisResult.save writes
                    render=lambda console: render_analysis(console, result, columns=cols, by=by,
                                                           grouped=sort is None))
