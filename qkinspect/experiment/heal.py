"""Healing: fine-tune an edited model with the edit kept, beside an unedited control fine-tuned the same way
(docs/training.md, "Healing").

For each run (unit x edit) of an experiment: a float32 copy of the model gets the edit written into its layers
and kept as a parametrisation (qkinspect.experiment.edits.parametrised), then trains `steps` optimizer steps (AdamW) on
windows of training text that share no token with the scored windows; the control, an unedited copy with the same
parameters trainable, trains on the same batches in the same order from the same seed. Both are scored on the
experiment's scored windows; the healed cost of the edit is loss(edited, healed) - loss(control, healed), paired
token by token, with its standard error from the spread between windows (tokens within a window are not
independent). The share of the unhealed cost that healing recovered is 1 - healed cost / unhealed cost.

What trains: "attention" (default), the q/k/v/o projections of every layer (with an edit's form in the edited
layers); "all", every parameter. The copies are the model's own classes; the user's model is never trained.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkinspect.errors import InputError
from qkinspect.experiment.edits.apply import apply_edit
from qkinspect.experiment.edits.names import Edit
from qkinspect.experiment.edits.parametrised import EditForm, canonical_from, parametrise
from qkinspect.experiment.model.runtime import CAUSAL, MASKED, HFModel
from qkinspect.experiment.model.scoring import Scorer, windows
from qkinspect.experiment.model.writeback import module_maps, write_layer
from qkinspect.experiment.requests import LIBRARY_NAMES, TRAINED, HealOptions, Names, Text
from qkinspect.experiment.results import HealedRun, Healing

Unit = list[tuple[int, list[int]]]


def heal_runs(hf: HFModel, scorer: Scorer, source: Text, tokens: int, window: int, units: Sequence[Unit],
              edits: Sequence[Edit], scope: str, rotary: str, exact: dict[tuple, float], baseline: float,
              opts: HealOptions, progress: Callable[[int, int], None] | None = None,
              names: Names = LIBRARY_NAMES) -> Healing:
    """Heal every (unit, edit) and the control; `exact` maps (edit, layer, head) to the unhealed Δloss. The caller
    has checked the request (requests.check_request) and the model (check_healable); a text too short to train
    on is an InputError naming the options as the caller spells them (`names`)."""
    t0 = time.perf_counter()
    batches, n_train, per, train_text = _train_batches(hf, source, tokens, window, opts, names)
    notes: list[str] = []
    tracks: dict[str, str] = {}
    total = 1 + len(units) * len(edits)
    control = _Healer(hf, {}, opts, batches, rotary)
    control.train(_tracker(opts, "control", control, tracks, notes))
    c_sums, c_counts = window_losses(control.model, hf.kind, scorer.inputs)
    control_loss = float(c_sums.sum() / c_counts.sum())
    control.release()
    done = 1
    if progress is not None:
        progress(done, total)
    runs = []
    for unit in units:
        for edit in edits:
            t1 = time.perf_counter()
            healer = _Healer(hf, {i: (edit, hs) for i, hs in unit}, opts, batches, rotary)
            name = _run_name(edit, unit, scope)
            healer.train(_tracker(opts, name, healer, tracks, notes))
            sums, counts = window_losses(healer.model, hf.kind, scorer.inputs)
            healer.release()  # one copy of the model at a time
            loss = float(sums.sum() / counts.sum())
            diff, se = paired_difference(sums, c_sums, counts)
            layer = unit[0][0] if scope != "model" else None
            head = unit[0][1][0] if scope == "head" else None
            unhealed = exact.get((str(edit), layer, head))
            runs.append(HealedRun(
                edit=str(edit), scope=scope, layer=layer, head=head, heads=sum(len(hs) for _, hs in unit),
                loss=loss, control_loss=control_loss, diff=diff, se=se, unhealed=unhealed,
                recovered=1 - diff / unhealed if unhealed else None, violation=healer.violation,
                train_loss=tuple(healer.losses), seconds=time.perf_counter() - t1))
            done += 1
            if progress is not None:
                progress(done, total)
    return Healing(
        steps=opts.steps, train=opts.train, trained=TRAINED[opts.train], trained_parameters=control.n_trained,
        parameters=control.n_params, lr=float(opts.lr), text=train_text, train_tokens=n_train,
        batch_windows=per, epochs=opts.steps * per * window / max(n_train, 1), control_loss=control_loss,
        control_gain=control_loss - baseline, control_train_loss=tuple(control.losses), runs=tuple(runs),
        seconds=time.perf_counter() - t0, tracks=tracks, notes=tuple(dict.fromkeys(notes)))


def check_healable(hf: HFModel, names: Names = LIBRARY_NAMES) -> None:
    """InputError (before any run) where the loaded model cannot be healed: no LM head (the rest of a heal request,
    the rotary gauge included, is checked before loading: qkinspect.experiment.requests)."""
    if hf.kind not in (CAUSAL, MASKED):
        raise InputError(f"{names.heal} trains on the model's own loss: it needs a causal or masked LM head (this "
                         "model is measured by drift)")


def _run_name(edit: Edit, unit: Unit, scope: str) -> str:
    if scope == "model":
        return f"{edit}-model".replace(":", "")
    layer = unit[0][0]
    return (f"{edit}-L{layer}" + (f"-H{unit[0][1][0]}" if scope == "head" else "")).replace(":", "")


# -- training text -------------------------------------------------------------------------------------------


def _train_batches(hf: HFModel, source: Text, tokens: int, window: int, opts: HealOptions,
                   names: Names = LIBRARY_NAMES) -> tuple[list[dict[str, Tensor]], int, int, str]:
    """The training batches (model inputs, masked-LM labels drawn once), the distinct training tokens, the
    windows per batch, and what the text is. Windows are shuffled once with the seed and gone through in that
    order, again if the steps need more."""
    per = max(1, opts.batch_tokens // window)
    need = opts.steps * per
    text = opts.text if opts.text is not None and opts.text.text != source.text else None
    if text is None:  # the scored text after its scored windows: the first rows `windows` cuts are those scored
        scored = windows(hf, source, tokens, window, names).shape[0]
        rows = windows(hf, source, tokens + need * window, window, names)[scored:]
        what = f"{source.name} after the {tokens} scored tokens"
    else:
        rows = windows(hf, text, need * window, window, names)
        what = text.name
    if rows.shape[0] == 0:
        raise InputError(f"{names.heal}: {what} leaves no tokens to train on (give {names.heal_text})")
    if rows.shape[1] != window:
        raise InputError(f"{names.heal}: {what} is shorter than one window of {window} tokens")
    g = torch.Generator().manual_seed(opts.seed)
    rows = rows[torch.randperm(rows.shape[0], generator=g)]
    trainer = Scorer(hf, rows, batch_tokens=per * window, seed=opts.seed + 1)  # its batches, masks drawn once
    return trainer.inputs, int(rows.numel()), per, what


# -- one healed model ------------------------------------------------------------------------------------------


class _Healer:
    """A float32 copy of the model with `edits` ({layer: (edit, heads)}) kept as parametrisations, trained."""

    def __init__(self, hf: HFModel, edits: dict[int, tuple[Edit, list[int]]], opts: HealOptions,
                 batches: list[dict[str, Tensor]], rotary: str):
        from qkinspect.loading import open_model

        self.opts, self.batches, self.kind = opts, batches, hf.kind
        self.model = _float32(copy.deepcopy(hf.model))
        self.hf = HFModel(self.model, hf.family, hf.kind, hf.tokenizer)
        self.device = next(self.model.parameters()).device
        with open_model(self.model) as m:
            key = m.info.blocks[0].key
            layers = [_on_cpu(m.layer(key, i)) for i in range(m.info.blocks[0].n_layers)]  # the edits run on CPU
        trained: list[nn.Parameter] = []
        self.forms: dict[int, tuple[EditForm, dict[str, Tensor]]] = {}
        for i, layer in enumerate(layers):
            block = self.hf.layers[i]
            if i in edits:
                edit, heads = edits[i]
                edited = apply_edit(layer, edit, heads, rotary=rotary).layer
                maps = module_maps(self.hf, edited)
                write_layer(self.hf, edited)
                expanded = edited.spec.n_kv_heads != layer.spec.n_kv_heads
                form = EditForm(edited, edit, heads, layer.kv_index() if expanded else None).to(self.device)
                trained += parametrise(block, maps, form)
                self.forms[i] = (form, maps)
            else:
                before = {id(p) for p in block.parameters()}
                write_layer(self.hf, layer)  # the same values, in modules of their own: the projections to train
                trained += [p for p in block.parameters() if id(p) not in before]
        del layers
        if opts.train == "attention":
            for p in self.model.parameters():
                p.requires_grad_(False)
            for p in trained:
                p.requires_grad_(True)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.n_trained = sum(p.numel() for p in self.params)
        self.n_params = sum(p.numel() for p in hf.model.parameters())
        self.losses: list[float] = []
        self.violation = self._violation()

    def release(self) -> None:
        """Drop the trained copy (its numbers stay)."""
        self.model = self.hf = self.forms = self.params = None  # type: ignore[assignment]

    def _violation(self) -> float:
        v = 0.0
        with torch.no_grad():
            for i, (form, maps) in self.forms.items():
                v = max(v, form.violation(canonical_from(self.hf.layers[i], maps, form)))
        return v

    def train(self, on_step: Callable[[nn.Module, int], None] | None = None) -> None:
        opt = torch.optim.AdamW(self.params, lr=self.opts.lr, weight_decay=0.0)
        self.model.train()
        if on_step is not None:
            on_step(self.model, 0)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.opts.seed)  # dropout draws the same masks in the control and the edited run
            for k in range(self.opts.steps):
                inputs = _to(self.batches[k % len(self.batches)], self.device)
                out = self.model(**_with_labels(inputs, self.kind))
                out.loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                self.losses.append(float(out.loss.detach()))
                self.violation = max(self.violation, self._violation())
                if on_step is not None:
                    on_step(self.model, k + 1)
        self.model.eval()


def _on_cpu(layer):
    """An AttentionLayer with its tensors on the CPU (a copy only where they are elsewhere)."""
    from dataclasses import fields, replace

    moved = {f.name: getattr(layer, f.name).cpu() for f in fields(layer)
             if isinstance(getattr(layer, f.name), Tensor) and not getattr(layer, f.name).is_cpu}
    return replace(layer, **moved) if moved else layer


def _to(inputs: dict, device: torch.device) -> dict:
    return {k: v.to(device) if isinstance(v, Tensor) else v for k, v in inputs.items()}


def _float32(model: nn.Module) -> nn.Module:
    """The copy's floating parameters and buffers in float32, in place (`Module.float()` is refused for a model
    transformers dequantized from GGUF, though its tensors are float32 already)."""
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.is_floating_point() and t.dtype != torch.float32:
                t.data = t.data.to(torch.float32)
    return model


def _with_labels(inputs: dict[str, Tensor], kind: str) -> dict[str, Tensor]:
    return {**inputs, "labels": inputs["input_ids"]} if kind == CAUSAL else inputs


def _tracker(opts: HealOptions, name: str, healer: _Healer, tracks: dict[str, str], notes: list[str]):
    """A step hook writing the run's metric trajectory (qkinspect.callback.Tracker), or None."""
    if opts.track is None:
        return None
    from qkinspect.callback import Tracker

    layers = sorted(healer.forms) or None
    tracker = Tracker(Path(opts.track) / name, layers=layers, name=name)
    failed: list[bool] = []

    def on_step(model: nn.Module, step: int) -> None:
        if failed or (step % opts.track_every and step != opts.steps):
            return
        try:
            tracker.measure(model, step)
            tracks[name] = str(tracker.folder)
        except InputError as e:  # e.g. K/V heads expanded by the edit: the config no longer describes the layer
            failed.append(True)
            notes.append(f"trajectory of {name} not measured: {e}")

    return on_step


# -- scoring -------------------------------------------------------------------------------------------------


def window_losses(model: nn.Module, kind: str, batches: list[dict[str, Tensor]]) -> tuple[Tensor, Tensor]:
    """Per scored window, the summed loss and the number of scored tokens (float64), over `batches` (a Scorer's
    inputs): next-token cross-entropy (causal) or masked-LM cross-entropy (masked)."""
    sums, counts = [], []
    model.eval()
    device = next(model.parameters()).device
    with torch.inference_mode():
        for inputs in batches:
            inputs = _to(inputs, device)
            out = model(**{k: v for k, v in inputs.items() if k != "labels"})
            logits = out.logits.float()
            if kind == CAUSAL:
                pred, target = logits[:, :-1], inputs["input_ids"][:, 1:]  # position t predicts token t+1
            else:
                pred, target = logits, inputs["labels"]
            ce = F.cross_entropy(pred.transpose(1, 2), target, reduction="none", ignore_index=-100)  # (B, T)
            sums.append(ce.double().sum(-1).cpu())
            counts.append((target != -100).sum(-1).double().cpu())
    return torch.cat(sums), torch.cat(counts)


def paired_difference(a: Tensor, b: Tensor, counts: Tensor) -> tuple[float, float | None]:
    """Mean per-token difference of two models' losses on the same tokens (window sums `a`, `b`), and its standard
    error treating windows as the independent units (a ratio estimator: Σd / Σn, its residuals d_w - mean n_w)."""
    d = a - b
    n = counts.sum()
    mean = d.sum() / n
    W = len(d)
    if W < 2:
        return float(mean), None
    resid = d - mean * counts
    se = torch.sqrt(W / (W - 1) * resid.square().sum()) / n
    return float(mean), float(se)
