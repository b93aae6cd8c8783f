"""Stacked training (docs/twin.md, "Stacked training"): the runs of one shape trained together in one process as
one batched model (`qkinspect.twin.batched.Stacked`), one forward and backward for all of them per step.

Nothing about a run changes: each starts from the tensors its single-run twin draws (`qkinspect.twin.model.build`,
the same code), reads its own seed's batches, follows its own learning rate's schedule and keeps its own
constraint. AdamW is elementwise, so one AdamW over the stacked tensors is each run's own: torch's fused AdamW
kernel, called once per learning rate on the views of the runs at that rate (the kernel the single-run twin
uses, `qkinspect.experiment.heal.adamw`). A run's records, tracking folder and checkpoint are the ones a single
run writes; `seconds` and `step_seconds` are the stack's, shared by its runs (`stack`: how many).

On a GPU the step reads nothing back to the host: the batches are gathered on the device from the token stream,
the learning rates are plain numbers of the schedule, the losses stay on the device until an evaluation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from qkinspect.errors import InputError
from qkinspect.twin.request import MATCHED, base_variant

Item = tuple[str, int, float]  # (variant, seed, lr)
BETAS, EPS = (0.9, 0.999), 1e-8  # torch's AdamW defaults, as `heal.adamw` uses them


def stack_kind(variant: str) -> tuple[str, str]:
    """What runs must share to stack: their tensors' shapes (a `+params` arm's MLP width is its own) and the
    attention function (standard, the Reformer's, bilinear)."""
    from qkinspect.twin.batched import FORMS

    return (variant if variant.endswith(MATCHED) else "", FORMS[base_variant(variant)].attention)


def plan_stacks(items: Sequence[Item], stack: int | None, largest: int) -> list[list[Item]]:
    """The runs as stacks: runs of one kind together (`stack_kind`), in plan order, at most `stack` a stack (None:
    `largest`, what fits in memory); within a stack ordered by form."""
    kinds: dict[tuple[str, str], list[Item]] = {}
    for item in items:
        kinds.setdefault(stack_kind(item[0]), []).append(item)
    size = max(1, stack or largest)
    out = []
    for runs in kinds.values():
        n = math.ceil(len(runs) / size)
        per = math.ceil(len(runs) / n)  # as even as the count allows
        for i in range(n):
            chunk = runs[i * per:(i + 1) * per]
            out.append(sorted(chunk, key=lambda it: base_variant(it[0])))
    return out


def memory_per_run(spec: dict[str, Any], vocab: int) -> int:
    """Bytes one run of the stack takes while it trains (float32): its tensors four times (weights, gradients,
    AdamW's two moments) and the activations of a step, kept for the backward (a generous count per layer)."""
    s = spec["shape"]
    D, L, T, B = s["d_model"], s["layers"], s["context"], spec["batch"]
    weights = 2 * vocab * D + L * 12 * D * D
    activations = B * T * (L * 24 * D + s["heads"] * T * L * 3 + 3 * vocab)
    return 4 * (4 * weights + activations)


def largest_stack(spec: dict[str, Any], vocab: int) -> int:
    """How many runs fit in half of the free memory of the device (at most 64)."""
    if spec["device"] == "cuda":
        import torch

        free = torch.cuda.mem_get_info()[0]
    else:
        try:
            import psutil

            free = psutil.virtual_memory().available
        except ImportError:  # pragma: no cover - psutil comes with distributed
            free = 4 << 30
    return int(max(1, min(64, free // 2 // memory_per_run(spec, vocab))))


def check_precision(precision: str, device: str, option: str) -> None:
    """InputError unless `precision` (checked by the request) can run on `device` (bf16: a CPU or GPU that has
    bfloat16); `option` names it as the caller spells it (`--precision bf16`)."""
    if precision == "float32":
        return
    import torch

    if device == "cuda":
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    else:
        ok = bf16_cpu()
    if not ok:
        raise InputError(f"{option}: this {'GPU' if device == 'cuda' else 'CPU'} has no bfloat16 support (train "
                         "in float32)")


def bf16_cpu() -> bool:
    """Whether this CPU computes in bfloat16 natively (oneDNN's check: AVX-512 BF16 or AMX)."""
    import torch

    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def check_compile(device: str, option: str) -> None:
    """InputError where torch.compile cannot compile here (no dynamo for this Python; no C++ compiler for the
    CPU's code, no triton for the GPU's)."""
    import importlib.util
    import shutil

    import torch

    why = None
    if not torch._dynamo.is_dynamo_supported():
        why = "torch.compile does not support this Python"
    elif device == "cuda" and importlib.util.find_spec("triton") is None:
        why = "torch.compile needs triton for the GPU, and it is not installed"
    elif device == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        why = "torch.compile needs a C++ compiler for the CPU, and none is on PATH"
    if why:
        raise InputError(f"{option}: {why}")


def run_stack(folder: str, items: Sequence[Item], spec: dict[str, Any], *, threads: int = 1,
              precision: str = "float32", compile: bool = False) -> list[dict[str, Any]]:
    """Train the runs `items` of one kind (`stack_kind`) as one stack; each run's result as `run_twin` returns
    it, in the order of `items` ({"error": why} for a run whose twin could not be built: the others train)."""
    import torch

    from qkinspect.twin.batched import Stacked, supported
    from qkinspect.twin.data import batch_starts
    from qkinspect.twin.folder import HELD_OUT, TRAIN, read_tokens
    from qkinspect.twin.heap import steady_allocations
    from qkinspect.twin.model import build
    from qkinspect.twin.request import LEGACY, Shape
    from qkinspect.twin.train import eval_steps, lr_at, run_tracker, save_tensors, trajectory

    torch.set_num_threads(threads)
    steady_allocations()
    t0 = time.perf_counter()
    root = Path(folder)
    s = spec["shape"]
    shape = Shape(s["arch"], s["layers"], s["d_model"], s["heads"], s["context"],
                  Path(s["config"]) if s["config"] else None)
    init, schedule = spec.get("init", LEGACY["init"]), spec.get("schedule", LEGACY["schedule"])
    failed: dict[int, str] = {}
    made: dict[int, Any] = {}
    for i, (v, seed, _) in enumerate(items):  # a run its twin cannot be built for fails alone
        try:
            made[i] = build(v, shape, spec["vocab_size"], seed, "cpu", init)
        except Exception as e:  # noqa: BLE001 - recorded as that run's failure; the others train
            failed[i] = " ".join(f"{type(e).__name__}: {e}".split())
    order = sorted(made, key=lambda i: base_variant(items[i][0]))  # by form: the stack's run order
    if not order:
        return [{"error": failed[i]} for i in range(len(items))]
    runs = [items[i] for i in order]
    built = [made[i] for i in order]
    why = supported(built[0].model.config)
    if why is not None:
        raise InputError(f"the batched twin does not reproduce this config ({why}); train it with stack 1")
    device = torch.device(spec["device"])
    model = Stacked.from_built([(base_variant(v), b) for (v, _, _), b in zip(runs, built, strict=True)]).to(device)
    R = len(runs)
    steps, batch, ctx = spec["steps"], spec["batch"], shape.context
    train = torch.from_numpy(np.asarray(read_tokens(root, TRAIN), dtype=np.int64)).to(device)
    held = np.asarray(read_tokens(root, HELD_OUT), dtype=np.int64)
    window = torch.arange(ctx + 1, device=device)
    starts = torch.stack([torch.from_numpy(batch_starts(len(train), ctx, batch, steps, seed))
                          for _, seed, _ in runs], 1).to(device)  # (steps, R, batch)
    ev = np.asarray(spec["eval_starts"], dtype=np.int64)
    eval_x = torch.from_numpy(held[ev[:, None] + np.arange(ctx + 1)[None, :]]).to(device)  # (N, ctx + 1)
    at = set(eval_steps(steps, spec["eval_every"]))
    trackers = [run_tracker(root, v, seed, lr, spec) for v, seed, lr in runs]
    plains = [None] * R
    opt = _StackedAdamW(model, [lr for _, _, lr in runs])
    autocast = _autocast(precision, device)
    loss_fn = torch.compile(model) if compile else model
    losses = torch.zeros(steps, R, device=device)  # read at evaluations only
    points: list[list[dict[str, Any]]] = [[] for _ in range(R)]
    violations = [b.violation() for b in built]
    step_seconds: list[float] = []
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    clock = {"train": 0.0, "since": 0.0}  # seconds of training steps, evaluations and tracking left out

    def evaluate(k: int) -> None:
        sync()
        now = time.perf_counter() - t0
        clock["train"] += now - clock["since"] if k else 0.0
        held_loss = held_out_losses(model, eval_x, batch, autocast)
        window_losses = losses[max(0, k - max(1, spec["eval_every"])):k].mean(0).tolist() if k else [None] * R
        for r in range(R):
            violations[r] = max(violations[r], violation(model, r, built[r]))
            points[r].append({"step": k, "tokens": k * batch * ctx, "train_loss": window_losses[r],
                              "val_loss": held_loss[r], "seconds": now})
        clock["since"] = time.perf_counter() - t0

    def track(k: int) -> None:
        if spec["track_every"] is None or (k % spec["track_every"] and k != steps):
            return
        for r in range(R):
            plains[r] = _plain(model, r, built[r], plains[r])
            with torch.no_grad():
                trackers[r].measure(plains[r], k)

    track(0)
    evaluate(0)
    model.train()
    for k in range(steps):
        t1 = time.perf_counter()
        x = train[starts[k].unsqueeze(-1) + window]  # (R, batch, ctx + 1), gathered on the device
        with autocast:
            per_run = loss_fn(x)
        per_run.sum().backward()  # the runs' parameters are disjoint: each run's gradient is its own loss's
        opt.step(lambda lr, k=k: lr_at(k, lr, spec["warmup"], steps, schedule))
        losses[k] = per_run.detach()
        if device.type == "cpu":
            step_seconds.append(time.perf_counter() - t1)
        track(k + 1)
        if k + 1 in at:
            evaluate(k + 1)
    sync()
    seconds = time.perf_counter() - t0
    if device.type != "cpu":  # no per-step clock on a GPU (it would wait for the device): the mean step
        step_seconds = [clock["train"] / max(1, steps)]
    train_losses = losses.T.tolist()
    out: list[dict[str, Any]] = [{"error": failed.get(i, "")} for i in range(len(items))]
    for r, (v, seed, lr) in enumerate(runs):
        tensors = _state(model, r)
        saved = save_tensors(root, v, seed, built[r], tensors) if spec["save_checkpoints"] else None
        result = {"variant": v, "seed": seed, "lr": lr, "params": built[r].params, "points": points[r],
                  "train_losses": train_losses[r], "violation": violations[r], "seconds": seconds,
                  "step_seconds": float(np.median(step_seconds)) if step_seconds else None,
                  "trajectory": trajectory(trackers[r]), "checkpoint": saved, "note": built[r].note,
                  "threads": threads, "init": built[r].init,
                  "stack": {"runs": R, "precision": precision, "compile": compile}}
        out[order[r]] = result
    return out


def _autocast(precision: str, device):
    import contextlib

    import torch

    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def held_out_losses(model, eval_x, batch: int, autocast) -> list[float]:
    """Each run's mean next-token loss over the fixed held-out windows (every run reads the same windows)."""
    import torch

    was = model.training
    model.eval()
    total = torch.zeros(model.R, device=eval_x.device, dtype=torch.float64)
    size = max(batch, 32)
    with torch.no_grad():
        for i in range(0, eval_x.shape[0], size):
            chunk = eval_x[i:i + size]
            with autocast:
                per_run = model(chunk.unsqueeze(0).expand(model.R, -1, -1))
            total += per_run.double() * chunk.shape[0]
    model.train(was)
    return (total / eval_x.shape[0]).tolist()


def _state(model, r: int):
    from qkinspect.twin.batched import to_state

    return {k: v.to("cpu", copy=True).float() for k, v in to_state(model.cfg, model.run_tensors(r)).items()}


def _plain(model, r: int, built, held):
    """A model of the run's class holding its tensors now (the trackers read weights only)."""
    import torch

    from qkinspect.twin.model import plain_copy

    tensors = {k: v for k, v in _state(model, r).items() if _plain_key(k)}
    if held is None:
        return plain_copy(built.model.config, tensors)
    with torch.no_grad():
        held.load_state_dict(tensors, strict=True)
    return held


def _plain_key(key: str) -> bool:
    return not key.endswith((".attn.qk", ".self_attn.qk"))


def violation(model, r: int, built) -> float:
    """The largest departure of run r's weights from its constraint now, as its single-run twin measures it (the
    forms' own check on the canonical tensors)."""
    import torch

    from qkinspect.twin.batched import FORMS

    g = next(g for g in model.groups if r in g.runs)
    t = model.run_tensors(r)
    D, H, d = model.D, model.H, model.d
    worst = 0.0
    with torch.no_grad():
        for i in range(model.L):
            if g.form == "wq_identity":
                eye = torch.eye(D, device=t[f"{i}.q"].device)
                worst = max(worst, float((t[f"{i}.q"] - eye).abs().max()))
            elif built.forms and FORMS[g.form].attention != "bilinear":
                canon = {n: t[f"{i}.{a}"].view(D, H, d).permute(1, 0, 2).to("cpu")
                         for n, a in (("W_Q", "q"), ("W_K", "k"), ("W_V", "v"))}
                worst = max(worst, float(built.forms[i].violation(canon)))
    return worst


class _StackedAdamW:
    """AdamW (no weight decay, torch's defaults) over the stacked tensors, each run at its own learning rate:
    torch's fused kernel once per distinct rate, on the runs' views (where a rate's runs are a range of a tensor's
    run axis, one view for them all)."""

    def __init__(self, model, lrs: Sequence[float]):
        import torch

        self.model = model
        self.params: list[tuple[Any, range]] = []  # (parameter, the stack's runs it holds, in order)
        for p in model.shared.values():
            self.params.append((p, range(model.R)))
        for g in model.groups:
            for p in g.free.values():
                self.params.append((p, g.runs))
        self.m = [torch.zeros_like(p) for p, _ in self.params]
        self.v = [torch.zeros_like(p) for p, _ in self.params]
        for p, _ in self.params:
            p.grad = torch.zeros_like(p)
        dev = self.params[0][0].device
        self.step_count = torch.zeros((), dtype=torch.float32, device=dev)
        self.rates = sorted(set(lrs))
        self.by_rate = {x: [r for r, y in enumerate(lrs) if y == x] for x in self.rates}
        self.views = {x: self._views(self.by_rate[x]) for x in self.rates}
        self.fused = True

    def _views(self, runs: list[int]):
        ps, ms, vs, where = [], [], [], []
        for n, (p, held) in enumerate(self.params):
            local = [r - held.start for r in runs if r in held]
            for a, b in _ranges(local):
                ps.append(p.data[a:b])
                ms.append(self.m[n][a:b])
                vs.append(self.v[n][a:b])
                where.append((n, a, b))
        return ps, ms, vs, where

    def step(self, rate: Callable[[float], float]) -> None:
        import torch

        self.step_count += 1
        for x in self.rates:
            ps, ms, vs, where = self.views[x]
            gs = [self.params[n][0].grad[a:b] for n, a, b in where]
            lr = rate(x)
            if self.fused:
                try:
                    torch._fused_adamw_(ps, gs, ms, vs, [], [self.step_count] * len(ps), lr=lr, beta1=BETAS[0],
                                        beta2=BETAS[1], weight_decay=0.0, eps=EPS, amsgrad=False, maximize=False)
                    continue
                except (RuntimeError, NotImplementedError):  # no fused kernel for this device in this torch
                    self.fused = False
            _adamw_reference(ps, gs, ms, vs, float(self.step_count), lr)
        for p, _ in self.params:
            p.grad.zero_()


def _adamw_reference(ps, gs, ms, vs, step: float, lr: float) -> None:
    """torch's AdamW update (no weight decay), one tensor after another."""
    import torch

    b1, b2 = BETAS
    c1, c2 = 1 - b1 ** step, 1 - b2 ** step
    with torch.no_grad():
        for p, g, m, v in zip(ps, gs, ms, vs, strict=True):
            m.lerp_(g, 1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            p.addcdiv_(m, (v.sqrt() / math.sqrt(c2)).add_(EPS), value=-lr / c1)


def _ranges(xs: list[int]) -> list[tuple[int, int]]:
    """Sorted integers as [a, b) ranges."""
    out: list[tuple[int, int]] = []
    for x in xs:
        if out and out[-1][1] == x:
            out[-1] = (out[-1][0], x + 1)
        else:
            out.append((x, x + 1))
    return out
