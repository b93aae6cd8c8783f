"""Measure a model's attention heads while it trains (docs/training.md).

`track(model, step, out_dir)` measures the model in memory as it is now (`qkinspect.analyze` on the live tensors,
nothing copied but one layer at a time in the compute dtype) and writes the result in the sweep folder format
(qkinspect.sweep.store): `qkinspect plot OUT_DIR --kind trajectory` and `qkinspect report OUT_DIR` read the folder
while the run goes on and after it ends. It returns per-layer summaries to log.

`QKCallback` does the same every N steps of a `transformers.Trainer` and sends the summaries through the trainer's
own loggers (TensorBoard, W&B, ... whatever `report_to` enabled) with `Trainer.log`, the public way to reach them:
a callback's `on_log` sees the logs only after the reporting callbacks (the trainer puts the callbacks it is given
after its own), so adding keys there would reach none of them. The callback therefore needs the trainer:
`QKCallback(out_dir, trainer=trainer)` or `QKCallback.attach(trainer, out_dir)`; without one it still writes the
folder and logs nothing.

Cost is bounded by what is measured: `layers`, `heads` and `metrics` (default: symmetry and the Q/K overlap, which
need no eigenvalues) and `every`; each measurement's seconds are recorded and logged.

Example:
    >>> from qkinspect.callback import QKCallback  # doctest: +SKIP
    >>> trainer = Trainer(model=model, args=args, train_dataset=data)  # doctest: +SKIP
    >>> QKCallback.attach(trainer, "runs/qk", every=50)  # doctest: +SKIP
    >>> trainer.train()  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from qkinspect.errors import InputError
from qkinspect.sweep import keys, store
from qkinspect.sweep.checkpoints import Checkpoint

DEFAULT_METRICS = ("symmetry", "overlap_qk")
STEP_SOURCE = "training"  # Checkpoint.step_source of a step measured during training
PREFIX = "qkinspect"
log = logging.getLogger("qkinspect.callback")


class Tracker:
    """Measures a model at chosen steps and keeps `out_dir` a sweep folder of the results (one per step).

    An existing folder written with the same options is continued (a resumed run adds its steps; a step measured
    again replaces the earlier result); one written with other options is refused.
    """

    def __init__(self, out_dir: str | Path, *, layers=None, heads=None, blocks=None,
                 metrics: Iterable[str] | None = DEFAULT_METRICS, precision: str = "float32",
                 fold_ln: bool = False, fold_qk_norm: bool = False, device: str | None = None,
                 name: str | None = None):
        from qkinspect.metrics.registry import resolve_metrics
        from qkinspect.sweep.request import check_request

        # the options checked as a sweep's are (its request: one check, before any step is measured)
        request = check_request(out_dir, {
            "layers": layers, "heads": heads, "blocks": blocks,
            "metrics": list(resolve_metrics(list(metrics) if metrics is not None else None)),
            "precision": precision, "fold_ln": fold_ln, "fold_qk_norm": fold_qk_norm}, device=device or "cpu")
        self.folder, self.options = request.out, request.options
        self.device = device
        self.name = name
        self.run = uuid.uuid4().hex[:8]
        store.check_folder(self.folder)
        self.checkpoints: dict[int, Checkpoint] = self._continued()

    def _continued(self) -> dict[int, Checkpoint]:
        """The steps an earlier run left in the folder, when its options are these."""
        path = self.folder / store.MANIFEST
        if not path.is_file():
            return {}
        found = store.read_sweep(self.folder)
        if found.options != self.options:
            raise InputError(f"{self.folder}: holds results measured with other options "
                             f"({_differences(found.options, self.options)}); choose another folder")
        return {c.step: c for c in found.checkpoints if c.identity in found.results}

    def measure(self, model: Any, step: int) -> dict[str, float]:
        """Analyse `model` as it is now, write the result as step `step`, and return the summaries to log:
        "qkinspect/<metric>/<block>_layer_<i>" (the median over the layer's measured heads) and
        "qkinspect/seconds" (this measurement's time)."""
        import torch

        from qkinspect import analysis  # the module: nothing inside qkinspect goes through the package face

        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise InputError(f"step={step!r}: a training step is a non-negative integer")
        t0 = time.perf_counter()
        device = self.device or _device_of(model)
        opts = {k: v for k, v in self.options.items() if v is not None}
        with torch.no_grad():
            result = analysis.analyze(model, device=device, spectra=None, **opts)
        seconds = time.perf_counter() - t0
        self._write(result, step, device, seconds)
        return {**summaries(result), f"{PREFIX}/seconds": seconds}

    def _write(self, result, step: int, device: str, seconds: float) -> None:
        name = self.name or result.model.name
        ck = Checkpoint(spec=result.model.source, revision=None, name=f"{name}@step-{step}",
                        identity=_identity(result.model.source, self.run, step), step=step, step_source=STEP_SOURCE)
        key = keys.result_key(ck, self.options)
        store.prepare(self.folder)
        payload = {"result": result.document(), "worker": "training", "threads": None, "seconds": seconds}
        store.write_json(store.result_path(self.folder, ck, key), store.result_document(ck, key, self.options,
                                                                                         payload, device))
        self.checkpoints[step] = ck
        store.write_manifest(self.folder, [self.checkpoints[s] for s in sorted(self.checkpoints)], self.options)


def _identity(source: str, run: str, step: int) -> str:
    """A measured step's identity: the model, this tracker and the step. Without "#", which marks the identity of a
    checkpoint on disk (path#fingerprint) whose result the sweep reader checks against that path."""
    return f"{source.replace('#', '%23')}@run-{run}/step-{step}"


def track(model: Any, step: int, out_dir: str | Path, **options) -> dict[str, float]:
    """Measure `model` (a transformers model in memory) at training step `step` and add the result to the sweep
    folder `out_dir`; returns per-layer summaries for your own logger. For hand-written training loops.

    Options are Tracker's: layers, heads, blocks, metrics (default symmetry and overlap_qk), precision, fold_ln,
    fold_qk_norm, device (default: where the model's parameters are), name.

    Example:
        >>> for step, batch in enumerate(loader, start=1):  # doctest: +SKIP
        ...     loss = model(**batch).loss; loss.backward(); opt.step(); opt.zero_grad()
        ...     if step % 100 == 0:
        ...         writer.add_scalars("qk", qkinspect.track(model, step, "runs/qk", layers="0-3"), step)
    """
    return Tracker(out_dir, **options).measure(model, step)


def summaries(result) -> dict[str, float]:
    """Per (block, layer) and head metric, the median over the measured heads (NaN heads left out)."""
    import numpy as np

    out: dict[str, list[float]] = {}
    for h in result.heads:
        for metric, v in h.values.items():
            out.setdefault(f"{PREFIX}/{metric}/{h.block}_layer_{h.layer}", []).append(v)
    medians = {}
    for k, vs in out.items():
        finite = [v for v in vs if math.isfinite(v)]
        medians[k] = float(np.median(finite)) if finite else float("nan")
    return medians


def _differences(a: dict, b: dict) -> str:
    return ", ".join(f"{k} {json.dumps(a.get(k))} vs {json.dumps(b.get(k))}" for k in sorted(set(a) | set(b))
                     if a.get(k) != b.get(k))


def _device_of(model: Any) -> str:
    try:
        p = next(model.parameters())
    except (StopIteration, AttributeError, TypeError):
        return "cpu"
    return "cuda" if p.device.type == "cuda" else "cpu"


def _callback_base():
    from transformers import TrainerCallback

    return TrainerCallback


def __getattr__(name: str):
    # QKCallback subclasses transformers.TrainerCallback, imported the first time QKCallback is asked for, so that
    # `import qkinspect` (and this module) stay light.
    if name == "QKCallback":
        cls = _make_callback()
        globals()["QKCallback"] = cls
        return cls
    raise AttributeError(f"module 'qkinspect.callback' has no attribute {name!r}")


def _make_callback():
    base = _callback_base()

    class QKCallback(base):
        """A `transformers.TrainerCallback` that measures the model every `every` optimizer steps (and at the
        start and the end of training), writes each step's result into the sweep folder `out_dir`, and logs the
        per-layer summaries through `trainer.log` when it knows the trainer.

        Args:
            out_dir: the sweep folder (created; a run with the same options continues it).
            every: measure after every `every`-th optimizer step (`state.global_step`).
            trainer: the Trainer whose loggers get the summaries (or use `QKCallback.attach`).
            at_start, at_end: also measure the weights before the first step and after the last.
            options: Tracker's (layers, heads, blocks, metrics, precision, fold_ln, fold_qk_norm, device, name).

        The weights measured at step s are those a checkpoint saved at step s holds (measured in `on_step_end`,
        before the trainer saves). Only the main process measures.
        """

        def __init__(self, out_dir: str | Path, *, every: int = 100, trainer: Any = None, at_start: bool = True,
                     at_end: bool = True, **options):
            if isinstance(every, bool) or not isinstance(every, int) or every < 1:
                raise InputError(f"every={every!r}: measure every N >= 1 steps")
            self.tracker = Tracker(out_dir, **options)
            self.every, self.trainer, self.at_start, self.at_end = every, trainer, at_start, at_end
            self.measured: dict[int, dict[str, float]] = {}  # step -> the summaries logged

        @classmethod
        def attach(cls, trainer: Any, out_dir: str | Path, **kwargs) -> QKCallback:
            """A callback bound to `trainer` and added to it."""
            cb = cls(out_dir, trainer=trainer, **kwargs)
            trainer.add_callback(cb)
            return cb

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            if self.trainer is None and state.is_world_process_zero:
                log.warning("QKCallback has no trainer: results go to %s, nothing to the trainer's loggers "
                            "(use QKCallback.attach(trainer, ...))", self.tracker.folder)
            return self._measure(state, model, control) if self.at_start else control

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % self.every == 0:
                return self._measure(state, model, control)
            return control

        def on_train_end(self, args, state, control, model=None, **kwargs):
            if self.at_end:
                return self._measure(state, model, control)
            return control

        def _measure(self, state, model, control):
            """Measure and log; returns the control the trainer goes on with. `trainer.log` ends with the
            callbacks' `on_log`, which clears `should_log` (the trainer's way to mark a step's logs as sent): the
            trainer decides whether to log its own loss and learning rate *after* `on_step_end`, so the flag it had
            set for this step is put back, or its own entry of the step would be lost."""
            step = int(state.global_step)
            if model is None or not state.is_world_process_zero or step in self.measured:
                return control
            logs = self.tracker.measure(model, step)
            self.measured[step] = logs
            if self.trainer is None:
                return control
            should_log = control.should_log
            self.trainer.log(dict(logs))
            after = self.trainer.control  # what the on_log callbacks returned (any flag they set is kept)
            after.should_log = should_log
            return after

    QKCallback.__module__ = __name__
    return QKCallback


__all__ = ["DEFAULT_METRICS", "QKCallback", "Tracker", "summaries", "track"]  # noqa: F822 (QKCallback: lazy)
