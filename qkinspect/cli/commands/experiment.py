"""`qkinspect experiment`: edit attention heads of a trained model and measure what it costs on real text."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from qkinspect.cli.heal_output import (
    HealEvalOpt,
    HealFloat32Opt,
    HealLrOpt,
    HealOpt,
    HealTextOpt,
    HealTokensOpt,
    HealTrackOpt,
    HealTrain,
    HealTrainOpt,
    heal_options,
)
from qkinspect.cli.options import (
    Device,
    DeviceOpt,
    FormatOpt,
    HeadsOpt,
    LayersOpt,
    ModelArg,
    OutputOpt,
    RevisionOpt,
)
from qkinspect.cli.output import Document, check_output, emit, note, progress
from qkinspect.selection import parse_indices


class Scope(str, Enum):
    head = "head"
    layer = "layer"
    model = "model"


class Rotary(str, Enum):
    gauge = "gauge"
    offset0 = "offset0"


EditOpt = Annotated[str, typer.Option(
    "--edit", "-e", metavar="EDIT[,EDIT…]",
    help="Edits: share_qk, tie_q, tie_k, symmetric, rank:K, share_qkv, ablate (docs/experiments.md).")]
ScopeOpt = Annotated[Scope, typer.Option(
    "--scope", help="One run per head, per layer (its chosen heads together), or one for the whole model.")]
TextOpt = Annotated[Path | None, typer.Option(
    "--text", metavar="FILE", help="UTF-8 text to measure on (default: Python's own pydoc_data.topics).")]
TokensOpt = Annotated[int, typer.Option("--tokens", metavar="N",
                                        help="Use the first N tokens of the text (at most 2**24).")]
WindowOpt = Annotated[int, typer.Option("--window", metavar="W",
                                        help="Tokens per window (non-overlapping; at most 2**24).")]
ReferenceOpt = Annotated[bool, typer.Option(
    "--reference/--no-reference", help="Also ablate the same heads, for Δloss / Δloss(ablate).")]
RotaryOpt = Annotated[Rotary, typer.Option(
    "--rotary", help="Rotary heads: edit within the gauge that commutes with the rotation (exact), or as if not "
                     "rotary (exact at offset 0 only; flagged).")]
EstimateOpt = Annotated[bool, typer.Option(
    "--estimate", help="Estimate every head × edit from one clean pass and --probes backward passes, instead of "
                       "one exact run each; heads whose edit moves the residual stream far are spot-checked on a "
                       "quarter of the text (flagged where the cost is far above the estimate), --verify heads are "
                       "run exactly to check it (--scope head).")]
ProbesOpt = Annotated[int | None, typer.Option(
    "--probes", metavar="K", help="--estimate: backward passes with sampled labels for the curvature term "
                                  "(default 16).")]
VerifyOpt = Annotated[int | None, typer.Option(
    "--verify", metavar="N", help="--estimate: run N heads per edit exactly (the predicted cheapest and "
                                  "costliest, flagged ones, a random sample) and report Spearman ρ (default 12; "
                                  "ρ needs 3 or more).")]
TokenizerOpt = Annotated[Path | None, typer.Option(
    "--tokenizer", metavar="PATH", help="A tokenizer folder or a vocab.txt, for a model folder without one.")]


def register(app: typer.Typer) -> None:
    @app.command()
    def experiment(
        model: ModelArg = None, edit: EditOpt = "share_qk", scope: ScopeOpt = Scope.head,
        layers: LayersOpt = None, heads: HeadsOpt = None, text: TextOpt = None, tokens: TokensOpt = 4096,
        window: WindowOpt = 512, reference: ReferenceOpt = True, rotary: RotaryOpt = Rotary.gauge,
        tokenizer: TokenizerOpt = None, revision: RevisionOpt = None, fmt: FormatOpt = None,
        output: OutputOpt = None, device: DeviceOpt = Device.cpu, estimate: EstimateOpt = False,
        probes: ProbesOpt = None, verify: VerifyOpt = None, heal: HealOpt = 0,
        heal_train: HealTrainOpt = HealTrain.attention, heal_lr: HealLrOpt = 1e-4,
        heal_batch_tokens: HealTokensOpt = 1024, heal_text: HealTextOpt = None, heal_track: HealTrackOpt = None,
        heal_eval_every: HealEvalOpt = None, heal_float32: HealFloat32Opt = False,
    ) -> None:
        """Edit attention heads (share one matrix for queries and keys, symmetrise, truncate the rank, ...), run
        the model on text and report each edit's cost: the loss change per head, per layer or for the model.

        Causal LMs are measured by next-token cross-entropy, masked LMs by masked-LM loss, encoders without a
        head by the drift of their final hidden states (docs/experiments.md).

        Cost (defaults: --tokens 4096, each edit and the ablation reference run per head; a busy 2-core EPYC): the
        demo model (MiniLM, 72 heads) about 2.7 s per run, 6.6 min for every head, 0.7 GiB; SmolLM2-135M about 30 s
        per run (every head: 540 runs, about 4.5 hours), 2.2 GiB. Time grows with runs x tokens: --scope layer or
        model, --layers, --tokens, or --estimate (every head from a few passes, 12 heads checked exactly) cut it.

        Example: qkinspect experiment SmolLM2-135M-Instruct.Q4_1.gguf --edit share_qk,rank:16 --layers 0-3
        --tokens 1024 -o runs.csv

        Example (every head, estimated, 12 heads per edit checked exactly): qkinspect experiment
        SmolLM2-135M-Instruct.Q4_1.gguf --edit share_qk,rank:16 --estimate --verify 12 -o map.json

        Example (healing: 50 fine-tuning steps with the edit kept, against a control): qkinspect experiment
        SmolLM2-135M-Instruct.Q4_1.gguf --edit share_qk --scope layer --layers 3 --heal 50

        Example (the cost curve, scored every 10 steps): qkinspect experiment SmolLM2-135M-Instruct.Q4_1.gguf
        --edit share_qk --scope layer --layers 3 --heal 100 --heal-eval-every 10 -o healed.json
        """
        check_output(fmt, output)
        layer_list, head_list = parse_indices(layers, "--layers"), parse_indices(heads, "--heads")
        from qkinspect.experiment import run_experiment  # torch-free until the request is checked
        from qkinspect.experiment.requests import CLI_NAMES

        with progress("experiment") as p:
            result = run_experiment(
                model, edit, scope=scope.value, layers=layer_list, heads=head_list, text=text, tokens=tokens,
                window=window, reference=reference, rotary=rotary.value, tokenizer=tokenizer, revision=revision,
                progress=p, device=device.value, estimate=estimate, probes=probes, verify=verify,
                heal=heal_options(heal, heal_train, heal_lr, heal_batch_tokens, heal_text, heal_track,
                                  eval_every=heal_eval_every, float32=heal_float32),
                names=CLI_NAMES)
        emit(experiment_document(result), fmt, output)
        for line in result.reader_notes():  # on stderr whatever -o is (the JSON keeps them too)
            note(line)


def experiment_document(result) -> Document:
    """The library's document (qkinspect.experiment.results), its rows, and the table that shows them (the notes
    go to stderr: `ExperimentResult.reader_notes`)."""
    from qkinspect.experiment.results import experiment_json

    return Document(json=experiment_json(result), rows=result.table_rows(), render=result.render_table)
