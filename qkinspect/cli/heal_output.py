"""`qkinspect experiment --heal`: its options, and the healed runs in the JSON document and the table."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any

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
    """The library's HealOptions from the CLI's, or None without --heal (the library checks them, and reads the
    text once they are)."""
    if not steps:
        return None
    from qkinspect.experiment.requests import HealOptions

    return HealOptions(steps=steps, train=train.value, lr=lr, batch_tokens=batch_tokens, text=text, track=track,
                       seed=seed, eval_every=eval_every, float32=float32)


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _recovered(r) -> str:
    """The share recovered, shown only where the unhealed cost stands above the noise of a difference on these
    windows (twice the healed difference's standard error); the JSON keeps every value."""
    if r.recovered is None or r.unhealed is None or r.se is None or r.unhealed <= 2 * r.se:
        return "-"
    return f"{100 * r.recovered:.0f}%"


def render_healing(console, healing) -> None:
    """The healed runs as a table: healed loss, the control's, their difference ± its standard error, the cost
    before healing and the share recovered."""
    from qkinspect.cli.tables import Column, fit_tables

    if healing is None:
        return
    h = healing
    dtype = "" if h.precision is None else f", {h.precision.dtype} on {h.device}"
    console.print(f"healing: {h.steps} steps of {h.batch_windows} windows{dtype}, lr {h.lr:g}, trained {h.trained} "
                  f"({h.trained_parameters:,} of {h.parameters:,} parameters), on {h.text} ({h.train_tokens} tokens,"
                  f" {h.epochs:.2f} passes); control after healing {h.control_loss:.4f} "
                  f"({h.control_gain:+.4f} from the baseline)", highlight=False, soft_wrap=True)
    runs = h.runs
    labels = [Column("edit", [r.edit for r in runs], left=True), Column("layer", [_fmt(r.layer, "d") for r in runs])]
    if any(r.head is not None for r in runs):
        labels.append(Column("head", [_fmt(r.head, "d") for r in runs]))
    values = [Column("healed", [_fmt(r.loss, ".4f") for r in runs]),
              Column("−control", [_fmt(r.diff, "+.4f") for r in runs]),
              Column("±se", [_fmt(r.se, ".4f") for r in runs]),
              Column("unhealed Δ", [_fmt(r.unhealed, "+.4f") for r in runs]),
              Column("recovered", [_recovered(r) for r in runs])]
    for t in fit_tables(labels, values, width=console.width):
        console.print(t)
    console.print("columns: healed=loss after healing, −control=healed loss − healed control loss (the edit's cost "
                  "after healing) ± its standard error, unhealed Δ=the edit's Δloss before healing, recovered=1 − "
                  "(−control)/(unhealed Δ), shown where the unhealed Δ exceeds 2 se", highlight=False, soft_wrap=True)
    for note in h.notes:
        console.print(f"note: {note}", highlight=False, soft_wrap=True)
