"""`qkinspect heads`: what each head does, beside what its weights say, and how the two relate."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qkinspect.cli.options import (
    Device,
    DeviceOpt,
    HeadsOpt,
    LayersOpt,
    ModelArg,
    OutputOpt,
    RevisionOpt,
)
from qkinspect.cli.output import Document, emit, note, progress, warn
from qkinspect.errors import InputError

FormatOpt = Annotated[str | None, typer.Option(
    "--format", "-f", show_default=False, metavar="FORMAT",
    help="table, json, ndjson or csv (one row per head: scores, their standard errors, weight metrics); default: "
         "from -o's extension, else table on a terminal and json in a pipe.")]
TextOpt = Annotated[Path | None, typer.Option(
    "--text", metavar="FILE", help="Text for previous-token, self, first-token and entropy (default: the topic "
                                   "pages of Python's own help, pydoc_data.topics).")]
WindowsOpt = Annotated[int, typer.Option("--windows", metavar="N", help="Windows of the text.")]
WindowOpt = Annotated[int, typer.Option("--window", metavar="T", help="Tokens per text window (BOS or [CLS] … "
                                                                      "[SEP] included).")]
SequencesOpt = Annotated[int, typer.Option(
    "--sequences", metavar="N", help="Repeated random sequences for induction and duplicate-token.")]
LengthOpt = Annotated[int, typer.Option("--length", metavar="T", help="Random tokens per sequence, before its "
                                                                      "repeat (a sequence is 2 x T tokens).")]
SeedOpt = Annotated[int, typer.Option("--seed", metavar="S", help="Seed of the random tokens and resamples.")]
BatchOpt = Annotated[int, typer.Option("--batch", metavar="N", help="Sequences per forward pass.")]
MetricsOpt = Annotated[list[str] | None, typer.Option(
    "--metrics", "-m", metavar="NAMES", help="Weight metrics to join (analyze's names and groups; default: "
                                             "analyze's defaults).")]
RelateOpt = Annotated[str, typer.Option(
    "--relate", metavar="NAMES", help="Weight metrics whose rank correlation with each score is computed, "
                                      "comma-separated ('' for none).")]
ResamplesOpt = Annotated[int, typer.Option("--resamples", metavar="N", help="Bootstrap resamples per ρ.")]
PermutationsOpt = Annotated[int, typer.Option("--permutations", metavar="N", help="Permutations per ρ.")]
TopOpt = Annotated[int, typer.Option("--top", metavar="N", help="Table: the N strongest heads per score.")]
TokenizerOpt = Annotated[Path | None, typer.Option(
    "--tokenizer", metavar="PATH", help="A tokenizer folder or vocab.txt (default: the model's own).")]
FoldLnOpt = Annotated[bool, typer.Option(
    "--fold-ln", help="The weight metrics with the input norm's gain folded into W_Q, W_K, W_V (as analyze --fold-ln); "
                      "the behaviour is the model's own either way.")]
FoldQkNormOpt = Annotated[bool, typer.Option(
    "--fold-qk-norm", help="The weight metrics with the q/k-norm gains (Qwen3, OLMo2, Gemma 3) folded in, as analyze "
                           "--fold-qk-norm.")]
ExportOpt = Annotated[Path | None, typer.Option(
    "--export", metavar="FILE", help="Also write the joined per-head table as tidy long rows for viewers (layer, "
                                     "head, kv_head, name, kind, value, se), .csv or .json (docs/heads.md, "
                                     "Viewers).")]


def register(app: typer.Typer) -> None:
    @app.command()
    def heads(
        model: ModelArg = None, layers: LayersOpt = None, heads: HeadsOpt = None, text: TextOpt = None,
        windows: WindowsOpt = 16, window: WindowOpt = 128,
        sequences: SequencesOpt = 64, length: LengthOpt = 64, seed: SeedOpt = 0, batch: BatchOpt = 16,
        metrics: MetricsOpt = None, relate: RelateOpt = "symmetry,overlap_qk,qk_effective_rank",
        fold_ln: FoldLnOpt = False, fold_qk_norm: FoldQkNormOpt = False, resamples: ResamplesOpt = 1000,
        permutations: PermutationsOpt = 1000,
        tokenizer: TokenizerOpt = None, top: TopOpt = 5, device: DeviceOpt = Device.cpu,
        revision: RevisionOpt = None, fmt: FormatOpt = None, output: OutputOpt = None, export: ExportOpt = None,
    ) -> None:
        """What each head does (previous-token, induction, duplicate-token, self, first-token and entropy scores
        from the model's own attention, each with its standard error) beside its weight metrics, and Spearman's ρ
        of each weight metric with each score, over all heads and within layers. --layers and --heads score only
        the heads selected, and ρ is over them.

        Example: qkinspect heads SmolLM2-135M-Instruct.Q4_1.gguf --sequences 32 --length 64

        Example (a row per head, for a spreadsheet): qkinspect heads ./my-llama -o heads.csv

        Example (the heads of layers 15-19 only): qkinspect heads SmolLM2-135M-Instruct.Q4_1.gguf --layers 15-19

        Example (saved, then drawn): qkinspect heads ./my-llama -o heads.json; qkinspect plot heads.json --kind
        heads --metric symmetry --score self -o self.png
        """
        from qkinspect.cli.output import check_output, choose_format
        from qkinspect.heads.request import CLI_NAMES
        from qkinspect.heads.run import heads as run_heads

        if fmt is not None and fmt not in ("table", "json", "ndjson", "csv"):
            raise InputError(f"--format {fmt}: choose table, json, ndjson or csv")
        check_output(fmt, output)
        name = choose_format(fmt, output)
        if top < 1:
            raise InputError(f"--top {top}: must be at least 1")
        if export is not None and export.suffix.lower() not in (".csv", ".json"):
            raise InputError(f"--export {export}: write .csv or .json")
        if export is not None:
            from qkinspect.files import check_writable

            check_writable(export)
        with progress("running heads") as p:
            result = run_heads(model, text=text, windows=windows, window=window, sequences=sequences,
                               length=length, seed=seed, batch=batch, metrics=metrics, relate=relate or None,
                               fold_ln=fold_ln, fold_qk_norm=fold_qk_norm, tokenizer=tokenizer, resamples=resamples,
                               permutations=permutations, device=device.value, progress=p, revision=revision,
                               names=CLI_NAMES, layers=layers, heads=heads)
        for w in result.warnings:
            warn(w)
        s = result.settings
        flags = "".join(f" {f}" for f, on in (("--fold-ln", s.fold_ln), ("--fold-qk-norm", s.fold_qk_norm)) if on)
        note(f"behaviour from {s.text} and {s.sequences} repeated random sequences; weight metrics as analyze{flags} "
             "measures them")
        if export is not None:
            write_export(result, export)
        emit(heads_document(result, top), name, output)


def write_export(result, path: Path) -> None:
    """The tidy long rows (`HeadsResult.headvis`) as CSV or JSON, atomically."""
    from qkinspect.files import atomic_write, save_json
    from qkinspect.formats import write_csv

    rows = result.headvis()
    if path.suffix.lower() == ".json":
        save_json(rows, path)
        return
    atomic_write(path, lambda f: write_csv(rows, f))


def heads_document(result, top: int = 5) -> Document:
    """JSON: the result's document (kind "heads"); rows: one per head; table: the strongest heads and the
    relations."""
    from qkinspect.terminal.heads import render_heads

    return Document(json=result.document(), rows=result.rows(), render=lambda console: render_heads(console, result,
                                                                                                    top))
