"""Healing as a curve: the healed models scored every N steps, and the precision healing trains in
(docs/training.md, "Healing").

- Scoring: a healed copy is scored exactly as the exact runs score the model (qkinspect.experiment.model.scoring.Scorer,
  the same batches, masks and per-token losses), float32, every `eval_every` steps and at the last. An edited run's
  point pairs it token by token with the control at the same step; its standard error is the exact runs' block
  standard error (measure.block_se). The control's own point pairs it with the unedited model.
- Precision: the training steps run under bfloat16 autocast where the hardware computes bfloat16 natively (a CUDA
  device, or a CPU with AMX-BF16) and the unedited copy's loss on the scored tokens under autocast differs from its
  float32 loss by less than the smallest standard error the experiment reports; else in float32. Scoring is always
  float32.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor

from qkinspect.experiment.model.scoring import Scorer, block_se
from qkinspect.experiment.results import HealChange, HealPoint, Precision

CPUINFO = Path("/proc/cpuinfo")


def eval_steps(steps: int, every: int | None) -> list[int]:
    """The steps a run is scored at: 0, every, 2·every, … and the last (only the last without `every`)."""
    if every is None:
        return [steps]
    return sorted({*range(0, steps + 1, every), steps})


def scored_tokens(scorer: Scorer, hf) -> Tensor:
    """The per-token losses of `hf` (a healed copy of the scorer's model) on the scorer's own batches, as
    `Scorer.score` computes them for the exact runs (float64, the scorer's token order; blocks: `scorer.blocks`)."""
    other = copy.copy(scorer)
    other.hf, other.cache, other.reference = hf, {}, []
    was = hf.model.training
    hf.model.eval()
    try:
        other.score(0)
    finally:
        hf.model.train(was)
    return other.token_losses


def point(step: int, tokens: Tensor, reference: Tensor, blocks: Tensor) -> HealPoint:
    d = tokens - reference
    return HealPoint(step=step, loss=float(tokens.mean()), diff=float(d.mean()), se=block_se(d, blocks))


def late_start(steps: int, at: list[int]) -> int | None:
    """The earlier point of the late change: the last step scored at or before three quarters of `steps`, after
    step 0 (None: nothing was scored between the first and the last step, so there is no late part to tell)."""
    inside = [k for k in at if 0 < k <= 0.75 * steps]
    return inside[-1] if inside else None


def late_change(start: int | None, end: int, tokens: dict[int, Tensor], reference: dict[int, Tensor] | Tensor,
                blocks: Tensor) -> HealChange | None:
    """How far a curve moved between steps `start` and `end`: mean over the scored tokens of
    (tokens[end] − ref[end]) − (tokens[start] − ref[start]) with `ref` the reference at each step (an edited run:
    the control's per-token losses at the same step; the control: the unedited model's, one tensor for both), and its
    block standard error: the two points are scored on the same tokens, so their difference is paired token by token
    and its standard error is usually below the √(se_start² + se_end²) of two unpaired points. None where `start`
    is (late_start found no point between step 0 and the last)."""
    if start is None:
        return None
    ref = reference if isinstance(reference, dict) else {start: reference, end: reference}
    d = (tokens[end] - ref[end]) - (tokens[start] - ref[start])
    return HealChange(start=start, end=end, change=float(d.mean()), se=block_se(d, blocks))


def bf16_hardware(device: torch.device) -> str | None:
    """Why this device computes bfloat16 natively (None: it does not, and autocast would be emulated)."""
    if device.type == "cuda":
        return f"CUDA ({torch.cuda.get_device_name(device)})" if torch.cuda.is_bf16_supported() else None
    if device.type == "cpu":
        try:
            flags = CPUINFO.read_text(errors="replace")
        except OSError:
            return None
        return "a CPU with AMX-BF16" if "amx_bf16" in flags.split() else None
    return None


@contextlib.contextmanager
def autocast(device: torch.device, on: bool) -> Iterator[None]:
    """bfloat16 autocast of the forward on `device` where `on`."""
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on):
        yield


def choose_precision(scorer: Scorer, hf, threshold: float | None, float32: bool,
                     option: str = "heal.float32") -> Precision:
    """Measure bfloat16 autocast against float32 on the unedited copy `hf` and decide (module docstring);
    `option` names how the caller asked for float32 (a `Names` entry: "--heal-float32" from the CLI)."""
    if float32:
        return Precision("float32", f"float32 asked for ({option})")
    device = next(hf.model.parameters()).device
    hardware = bf16_hardware(device)
    if hardware is None:
        return Precision("float32", f"{device.type}: no native bfloat16 (AMX-BF16 or CUDA)")
    if threshold is None:
        return Precision("float32", "no standard error to compare the bfloat16 loss with")
    full = float(scored_tokens(scorer, hf).mean())
    with autocast(device, True):
        half = float(scored_tokens(scorer, hf).mean())
    if abs(half - full) < threshold:
        return Precision("bfloat16", f"{hardware}: the autocast loss is within the smallest standard error",
                         full, half, threshold)
    return Precision("float32", f"{hardware}: the autocast loss differs by more than the smallest standard error",
                     full, half, threshold)
