"""One twin run, the sweep engine's task: build the twin of (variant, seed), train it at one learning rate on its
seed's batches, evaluate it on the fixed held-out windows, and return its records as plain JSON-ready data.

Nothing here writes into the twin folder but the run's own tracking folder and checkpoint (the client writes the
run's file when it arrives), so a task can run on any worker that reads the folder's token streams.

The schedule: linear warm-up over `warmup` steps to `lr`, then (`cosine`, nanoGPT's) cosine to lr/10 at the last
step, or (`constant`) the rate held to the end; AdamW without weight decay (`qkinspect.experiment.heal.adamw`,
healing's). The loss is next-token cross-entropy on windows of `context` tokens (the window's `context + 1` tokens
give the targets), in nats.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from qkinspect.twin.folder import HELD_OUT, TRAIN, checkpoint_dir, make_room, own_dir, read_tokens, run_name, track_dir


def lr_at(step: int, lr: float, warmup: int, steps: int, schedule: str = "cosine") -> float:
    """The learning rate of optimizer step `step` (0-based): warm-up, then cosine to lr/10 (or held: `constant`)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if schedule == "constant":
        return lr
    span = max(1, steps - warmup)
    return lr / 10 + (lr - lr / 10) * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / span)))


def eval_steps(steps: int, every: int) -> list[int]:
    return sorted({0, *range(every, steps + 1, every), steps})


def run_twin(folder: str, variant: str, seed: int, lr: float, spec: dict[str, Any], *, threads: int = 1,
             on_step: Callable[[Any, int], None] | None = None) -> dict[str, Any]:
    """Train one twin; its curve, trajectory, free parameters, seconds and constraint check as a dict. `spec`:
    the request's `training()` with the vocabulary size and the chosen evaluation offsets. `on_step(built, k)`:
    after step k (tests: the constraint at every step)."""
    import torch

    from qkinspect.twin.data import batch_starts, gather
    from qkinspect.twin.model import build
    from qkinspect.twin.request import LEGACY, Shape

    torch.set_num_threads(threads)
    from qkinspect.twin.heap import steady_allocations

    steady_allocations()  # as a stack's (the comparison stays fair; a single run's step faults little anyway)
    t0 = time.perf_counter()
    root = Path(folder)
    train, held = read_tokens(root, TRAIN), read_tokens(root, HELD_OUT)
    s = spec["shape"]
    shape = Shape(s["arch"], s["layers"], s["d_model"], s["heads"], s["context"],
                  Path(s["config"]) if s["config"] else None)
    device = torch.device(spec["device"])
    init, schedule = spec.get("init", LEGACY["init"]), spec.get("schedule", LEGACY["schedule"])
    built = build(variant, shape, spec["vocab_size"], seed, spec["device"], init)
    steps, batch, ctx = spec["steps"], spec["batch"], shape.context
    starts = batch_starts(len(train), ctx, batch, steps, seed)
    eval_x = torch.from_numpy(gather(np.asarray(held), np.asarray(spec["eval_starts"], dtype=np.int64),
                                     ctx).astype(np.int64)).to(device)
    at = set(eval_steps(steps, spec["eval_every"]))
    tracker = run_tracker(root, variant, seed, lr, spec)
    from qkinspect.experiment.heal import adamw

    opt = adamw(built.trained, lr)
    points: list[dict[str, Any]] = []
    losses: list[float] = []
    violation = built.violation()
    step_seconds: list[float] = []
    built.model.train()

    def evaluate(k: int) -> None:
        nonlocal violation
        violation = max(violation, built.violation())
        points.append({"step": k, "tokens": k * batch * ctx,
                       "train_loss": float(np.mean(losses[-max(1, spec["eval_every"]):])) if losses else None,
                       "val_loss": held_out_loss(built, eval_x, batch), "seconds": time.perf_counter() - t0})

    measure(tracker, built, 0, steps, spec)
    evaluate(0)
    for k in range(steps):
        t1 = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = lr_at(k, lr, spec["warmup"], steps, schedule)
        x = torch.from_numpy(gather(train, starts[k], ctx).astype(np.int64)).to(device)  # (batch, context + 1)
        losses.append(train_step(built, opt, x))
        step_seconds.append(time.perf_counter() - t1)
        if on_step is not None:
            on_step(built, k + 1)
        measure(tracker, built, k + 1, steps, spec)
        if k + 1 in at:
            evaluate(k + 1)
    built.model.eval()
    saved = save_checkpoint(root, variant, seed, built) if spec["save_checkpoints"] else None
    return {"variant": variant, "seed": seed, "lr": lr, "params": built.params, "points": points,
            "train_losses": losses, "violation": violation, "seconds": time.perf_counter() - t0,
            "step_seconds": float(np.median(step_seconds)) if step_seconds else None,
            "trajectory": trajectory(tracker), "checkpoint": saved, "note": built.note, "threads": threads,
            "init": built.init}


def train_step(built, opt, x) -> float:
    """One optimizer step of the twin on windows `x` (B, context + 1); its loss. The constraint's form is computed
    once for the forward and its backward (`parametrised.cached`)."""
    from qkinspect.experiment.edits.parametrised import cached

    with cached(built.forms):
        loss = next_token_loss(built.model, x)
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def next_token_loss(model, x):
    """Mean cross-entropy of each window's next tokens: inputs x[:, :-1], targets x[:, 1:] (B, context)."""
    import torch

    logits = model(input_ids=x[:, :-1]).logits  # (B, T, V)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), x[:, 1:].reshape(-1))


def held_out_loss(built, eval_x, batch: int) -> float:
    """The mean next-token loss over the fixed held-out windows (every window has the same number of targets)."""
    import torch

    from qkinspect.experiment.edits.parametrised import cached

    was = built.model.training
    built.model.eval()
    total = 0.0
    with torch.no_grad(), cached(built.forms):
        size = max(batch, 32)  # windows per forward pass
        for i in range(0, eval_x.shape[0], size):
            chunk = eval_x[i:i + size]
            total += float(next_token_loss(built.model, chunk)) * chunk.shape[0]
    built.model.train(was)
    return total / eval_x.shape[0]


def run_tracker(root: Path, variant: str, seed: int, lr: float, spec: dict[str, Any]):
    if spec["track_every"] is None:
        return None
    from qkinspect.callback import Tracker

    folder = track_dir(root, variant, seed, lr)
    own_dir(folder.parent)
    make_room(folder)  # the run's own tracking folder, never a link out of the twin folder
    return Tracker(folder, name=run_name(variant, seed, lr))


def measure(tracker, built, step: int, steps: int, spec: dict[str, Any]) -> None:
    if tracker is None or (step % spec["track_every"] and step != steps):
        return
    import torch

    from qkinspect.experiment.edits.parametrised import cached

    with torch.no_grad(), cached(built.forms):
        tracker.measure(built.model, step)


def trajectory(tracker) -> list[dict[str, Any]]:
    """(step, layer, head, metric, value) rows of the tracking folder."""
    if tracker is None:
        return []
    from qkinspect.sweep.store import read_sweep

    metrics = tracker.options["metrics"]
    out = []
    for row in read_sweep(tracker.folder).rows(by="head"):
        for m in metrics:
            v = row.get(m)
            if isinstance(v, (int, float)):
                out.append({"step": row["step"], "layer": row["layer"], "head": row["head"], "metric": m,
                            "value": float(v) if math.isfinite(v) else None})
    return out


def save_checkpoint(root: Path, variant: str, seed: int, built) -> str:
    """The trained twin as a transformers folder (config.json, model.safetensors), read back into a plain model of
    its class; a twin no class holds (bilinear) saves its tensors with the config and a note."""
    from qkinspect.twin.model import state_tensors

    return save_tensors(root, variant, seed, built, state_tensors(built.model))


def save_tensors(root: Path, variant: str, seed: int, built, tensors) -> str:
    """`save_checkpoint` of the twin's `tensors` (its class's names, as `state_tensors` reads them): a stacked
    run's checkpoint (qkinspect.twin.stacked) is written by the same code."""
    from qkinspect.twin.model import plain_copy

    folder = checkpoint_dir(root, variant, seed)
    own_dir(folder.parent)
    own_dir(folder)
    for name in ("config.json", "generation_config.json", "model.safetensors", "README.txt"):  # never through a link
        make_room(folder / name)
    if built.plain:
        from qkinspect.experiment.model.runtime import quiet_transformers

        with quiet_transformers():  # no "Writing model shards" bar: the run's line on stderr says it finished
            plain_copy(built.model.config, tensors).save_pretrained(folder)
        if built.note:
            (folder / "README.txt").write_text(built.note + "\n", encoding="utf-8")
    else:
        from safetensors.torch import save_file

        built.model.config.save_pretrained(folder)
        save_file(tensors, str(folder / "model.safetensors"))
        (folder / "README.txt").write_text(built.note + "\n", encoding="utf-8")
    return str(folder.relative_to(root))
