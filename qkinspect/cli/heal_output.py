"""`qkinspect experiment --heal`: its options, as the library's HealOptions (the healed runs' table is
qkinspect.terminal.healing)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer


class HealTrain(str, Enum):
    attention = "attention"
    all = "all"


HealOpt = Annotated[int, typer.Option(
    "--heal", metavar="STEPS", help="After each edit, fine-tune STEPS steps with the edit kept, beside an unedited "
                                    "control trained the same way. 0: no healing.")]
HealTrainOpt = Annotated[HealTrain, typer.Option(
    "--heal-train", help="What healing trains: the attention projections of every layer, or all parameters.")]
HealLrOpt = Annotated[float, typer.Option("--heal-lr", metavar="LR", help="Healing learning rate (AdamW, constant).")]
HealTokensOpt = Annotated[int, typer.Option(
    "--heal-batch", metavar="N", help="Tokens per healing step (in whole windows).")]
HealTextOpt = Annotated[Path | None, typer.Option(
    "--heal-text", metavar="FILE", help="UTF-8 text to heal on (default: the --text after its scored tokens).")]
HealEvalOpt = Annotated[int | None, typer.Option(
    "--heal-eval-every", metavar="N", help="Score the healed runs and the control every N steps (and at the last): "
                                           "the cost curve in the JSON (plot --kind healing).")]
HealFloat32Opt = Annotated[bool, typer.Option(
    "--heal-float32", help="Train in float32 even where bfloat16 autocast would be used (AMX CPUs, CUDA).")]
HealTrackOpt = Annotated[Path | None, typer.Option(
    "--heal-track", metavar="DIR", help="Write each healing run's metric trajectory as a sweep folder under DIR "
                                        "(qkinspect plot DIR/control --kind trajectory).")]


def heal_options(steps: int, train: HealTrain, lr: float, batch_tokens: int, text: Path | None,
                 track: Path | None, seed: int = 0, eval_every: int | None = None, float32: bool = False):
    """The library's HealOptions from the CLI's, or None without --heal; a --heal-* option without --heal is
    refused by the library in the CLI's names (it would do nothing)."""
    from qkinspect.experiment.requests import CLI_NAMES
    from qkinspect.experiment.requests import heal_options as requested

    return requested(steps, CLI_NAMES, train=train.value, lr=lr, batch_tokens=batch_tokens, text=text, track=track,
                     seed=seed, eval_every=eval_every, float32=float32)
