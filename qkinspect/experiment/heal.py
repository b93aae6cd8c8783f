"""Healing: fine-tune an edited model with the edit kept, beside an unedited control fine-tuned the same way
(docs/training.md, "Healing").

For each run (unit x edit) of an experiment: a float32 copy of the model gets the edit written into its layers
and kept as a parametrisation (qkinspect.experiment.edits.parametrised), then trains `steps` optimizer steps (AdamW) on
windows of training text that share no token with the scored windows; the control, an unedited copy with the same
parameters trainable, trains on the same batches in the same order from the same seed. Both are scored on the
experiment's scored windows as the exact runs are (qkinspect.experiment.heal_curve), every `eval_every` steps and
at the last: the healed cost of the edit is loss(edited, healed) - loss(control, healed), paired token by token,
with the exact runs' block standard error. The share of the unhealed cost that healing recovered is
1 - healed cost / unhealed cost. The training steps run under bfloat16 autocast where that is measured to be safe
(heal_curve.choose_precision).

What trains: "attention" (default), the q/k/v/o projections of every layer (with an edit's form in the edited
layers); "all", every parameter. The copies are the model's own classes; the user's model is never trained.
"""

from __future__ import annotations

import copy
import ctypes
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from qkinspect.errors import InputError
from qkinspect.experiment.edits.apply import apply_edit
from qkinspect.experiment.edits.names import Edit
from qkinspect.experiment.edits.parametrised import CANON, EditForm, Strided, cached, canonical_from, parametrise
from qkinspect.experiment.heal_curve import (
    autocast,
    choose_precision,
    eval_steps,
    late_change,
    late_start,
    point,
    scored_tokens,
)
from qkinspect.experiment.model.runtime import CAUSAL, MASKED, HFModel
from qkinspect.experiment.model.scoring import Scorer, windows
from qkinspect.experiment.model.writeback import module_maps, write_layer
from qkinspect.experiment.requests import LIBRARY_NAMES, TRAINED, HealOptions, Text
from qkinspect.experiment.results import HealedRun, Healing, HealPoint
from qkinspect.names import Names
from qkinspect.progress import phase

Unit = list[tuple[int, list[int]]]


def heal_runs(hf: HFModel, scorer: Scorer, source: Text, tokens: int, window: int, units: Sequence[Unit],
              edits: Sequence[Edit], scope: str, rotary: str, exact: dict[tuple, float], baseline: float,
              opts: HealOptions, progress: Callable[..., None] | None = None,
              threshold: float | None = None, names: Names = LIBRARY_NAMES) -> Healing:
    """Heal every (unit, edit) and the control; `exact` maps (edit, layer, head) to the unhealed Δloss, `threshold`
    is the smallest standard error of the exact runs (bfloat16 autocast must stay within it). The caller has checked
    the request (requests.check_request) and the model (check_healable); a text too short to train on is an
    InputError naming the options as the caller spells them (`names`)."""
    t0 = time.perf_counter()
    batches, n_train, per, train_text = _train_batches(hf, source, tokens, window, opts, names)
    notes: list[str] = []
    tracks: dict[str, str] = {}
    maps: dict[tuple, dict[str, Tensor]] = {}  # the write-back's layout per layer, probed once for all runs
    at = eval_steps(opts.steps, opts.eval_every)
    total = 1 + len(units) * len(edits)
    probe_layouts(hf, units, edits, rotary, maps, names)  # a layout healing cannot keep: refused before training
    control = Healer(hf, {}, opts, batches, rotary, maps)
    precision = choose_precision(scorer, control.hf, threshold, opts.float32, names.heal_float32)
    c_tokens: dict[int, Tensor] = {}
    control.train(_tracker(opts, "control", control, tracks, notes), precision.dtype == "bfloat16",
                  at, lambda step: c_tokens.__setitem__(step, control.score(scorer)),
                  _steps(progress, f"healing 1/{total}: control", opts.steps))
    blocks = scorer.blocks
    control_curve = tuple(point(k, c_tokens[k], scorer.base_tokens, blocks) for k in at)
    start = late_start(opts.steps, at)
    control_loss = control_curve[-1].loss
    control.release()
    done = 1
    runs, step_times = [], []
    for unit in units:
        for edit in edits:
            t1 = time.perf_counter()
            healer = Healer(hf, {i: (edit, hs) for i, hs in unit}, opts, batches, rotary, maps)
            name = _run_name(edit, unit, scope)
            curve: list[HealPoint] = []
            e_tokens: dict[int, Tensor] = {}

            def evaluate(step: int, healer=healer, curve=curve, e_tokens=e_tokens) -> None:
                e_tokens[step] = healer.score(scorer)
                curve.append(point(step, e_tokens[step], c_tokens[step], blocks))

            healer.train(_tracker(opts, name, healer, tracks, notes), precision.dtype == "bfloat16", at, evaluate,
                         _steps(progress, f"healing {done + 1}/{total}: {name}", opts.steps))
            step_times += healer.step_seconds
            healer.release()  # one copy of the model at a time
            last = curve[-1]
            layer = unit[0][0] if scope != "model" else None
            head = unit[0][1][0] if scope == "head" else None
            unhealed = exact.get((str(edit), layer, head))
            runs.append(HealedRun(
                edit=str(edit), scope=scope, layer=layer, head=head, heads=sum(len(hs) for _, hs in unit),
                loss=last.loss, control_loss=control_loss, diff=last.diff, se=last.se, unhealed=unhealed,
                recovered=1 - last.diff / unhealed if unhealed else None, violation=healer.violation,
                train_loss=tuple(healer.losses), seconds=time.perf_counter() - t1, curve=tuple(curve),
                late=late_change(start, opts.steps, e_tokens, c_tokens, blocks)))
            done += 1
    return Healing(
        steps=opts.steps, train=opts.train, trained=TRAINED[opts.train], trained_parameters=control.n_trained,
        parameters=control.n_params, lr=float(opts.lr), text=train_text, train_tokens=n_train,
        batch_windows=per, epochs=opts.steps * per * window / max(n_train, 1), control_loss=control_loss,
        control_gain=control_loss - baseline, control_train_loss=tuple(control.losses), runs=tuple(runs),
        seconds=time.perf_counter() - t0, tracks=tracks, notes=tuple(dict.fromkeys(notes)),
        eval_every=opts.eval_every, control_curve=control_curve, precision=precision,
        device=str(next(hf.model.parameters()).device),
        step_seconds=float(torch.tensor(step_times).median()) if step_times else None,
        control_late=late_change(start, opts.steps, c_tokens, scorer.base_tokens, blocks))


def probe_layouts(hf: HFModel, units: Sequence[Unit], edits: Sequence[Edit], rotary: str,
                  layouts: dict[tuple, dict[str, Tensor | Strided]], names: Names = LIBRARY_NAMES) -> None:
    """The write-back's layout of every edited layer the runs will build (`layouts`, keyed as the Healers key it:
    they reuse it), probed on the scored model before any training (each probe undone exactly): a layer whose
    write-back does arithmetic on the values (OLMo2's whole-projection key norm repeated for grouped-query heads
    that an edit gave keys of their own) cannot keep the edit while it trains, and is refused here, not after the
    control has trained. Where the scored model is not float32 (a model in memory), its layers cannot hold the
    probes exactly: each Healer probes its float32 copy instead, as it does for a layout not probed here."""
    from qkinspect.loading import open_model

    if any(p.is_floating_point() and p.dtype != torch.float32 for p in hf.model.parameters()):
        return
    with open_model(hf.model) as source:
        block_key = source.info.blocks[0].key
        for unit in units:
            for edit in edits:
                for i, heads in unit:
                    layer = on_cpu(source.layer(block_key, i))
                    edited = apply_edit(layer, edit, heads, rotary=rotary).layer
                    key = _layout_key(i, edited)
                    if key in layouts:
                        continue
                    try:
                        layouts[key] = module_maps(hf, edited)
                    except InputError as e:
                        raise InputError(f"{names.heal} cannot keep {edit} on layer {i} while it trains: "
                                         f"{str(e).removeprefix('healing: ')}") from None


def _layout_key(i: int, edited) -> tuple:
    """The write-back's layout depends on the layer and its tensors' shapes, not their values."""
    return (i, *((n, tuple(t.shape)) for n in CANON if (t := getattr(edited, n)) is not None))


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


class Healer:
    """A float32 copy of the model with `edits` ({layer: (edit, heads)}) kept as parametrisations, trained on
    `batches` (model inputs) by `train` (attention-only: the weights it does not train are the scored model's own,
    not copied: `_copy`). `layouts`: the write-back's layout per layer and tensor shapes, shared
    between the healers of one experiment (filled as they are built)."""

    def __init__(self, hf: HFModel, edits: dict[int, tuple[Edit, list[int]]], opts: HealOptions,
                 batches: list[dict[str, Tensor]], rotary: str, layouts: dict[tuple, dict[str, Tensor]] | None = None):
        layouts = {} if layouts is None else layouts
        from qkinspect.loading import open_model

        self.opts, self.batches, self.kind = opts, batches, hf.kind
        self.model = _float32(_copy(hf.model, share=opts.train == "attention"))
        self.hf = HFModel(self.model, hf.family, hf.kind, hf.tokenizer)
        self.device = next(self.model.parameters()).device
        trained: list[nn.Parameter] = []
        self.forms: dict[int, tuple[EditForm, dict[str, Tensor | Strided]]] = {}
        self.whole: dict[int, dict[str, bool]] = {}  # per edited layer: which module weights the form fills whole
        with open_model(self.model) as source:
            block_key, n_layers = source.info.blocks[0].key, source.info.blocks[0].n_layers
            for i in range(n_layers):  # one layer at a time: what a layer frees, the next one's tensors reuse
                layer = on_cpu(source.layer(block_key, i))  # the edits run on CPU
                block = self.hf.layers[i]
                if i in edits:
                    edit, heads = edits[i]
                    edited = apply_edit(layer, edit, heads, rotary=rotary).layer
                    key = _layout_key(i, edited)
                    if key not in layouts:  # probed before training (probe_layouts) where heal_runs built it
                        layouts[key] = module_maps(self.hf, edited)
                    maps = {name: m.to(self.device) for name, m in layouts[key].items()}  # on the CPU: no copy
                    self.whole[i] = {name: isinstance(m, Strided) or bool((m >= 0).all())
                                     for name, m in layouts[key].items()}
                    write_layer(self.hf, edited)
                    expanded = edited.spec.n_kv_heads != layer.spec.n_kv_heads
                    form = EditForm(edited, edit, heads, layer.kv_index() if expanded else None).to(self.device)
                    trained += parametrise(block, maps, form)
                    self.forms[i] = (form, maps)
                    del edited
                else:
                    before = {id(p) for p in block.parameters()}
                    write_layer(self.hf, layer)  # the same values, in modules of their own: the projections to train
                    trained += [p for p in block.parameters() if id(p) not in before]
                del layer
        del source, block
        return_freed_memory()  # the build's temporaries, so that they do not sit beside the training's peak
        if opts.train == "attention":
            for p in self.model.parameters():
                p.requires_grad_(False)
            for p in trained:
                p.requires_grad_(True)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        held = {p.data_ptr() for p in hf.model.parameters() if p.numel()}
        if any(p.data_ptr() in held for p in self.params if p.numel()):  # _copy's promise: never trained
            raise AssertionError("healing: a trained parameter shares its memory with the scored model")
        self.n_trained = sum(p.numel() for p in self.params)
        self.n_params = sum(p.numel() for p in hf.model.parameters())
        self.losses: list[float] = []
        self.step_seconds: list[float] = []
        self.violation = self._violation()

    def release(self) -> None:
        """Drop the trained copy (its numbers stay)."""
        self.model = self.hf = self.forms = self.params = None  # type: ignore[assignment]

    def _violation(self) -> float:
        """The largest departure from the edit's set over the edited layers, read back from the modules (one
        synchronisation for all layers)."""
        if not self.forms:
            return 0.0
        with torch.no_grad(), cached(self._forms()):
            v = [form.violation(canonical_from(self.hf.layers[i], maps, form, self.whole[i]))
                 for i, (form, maps) in self.forms.items()]
        return float(torch.stack([x.float() for x in v]).max())

    def _forms(self) -> list[EditForm]:
        return [form for form, _ in self.forms.values()]

    def score(self, scorer: Scorer) -> Tensor:
        """The per-token losses of the model as it is now, scored as the exact runs are (float32)."""
        with cached(self._forms()):
            return scored_tokens(scorer, self.hf)

    def train(self, on_step: Callable[[nn.Module, int], None] | None = None, bf16: bool = False,
              at: Sequence[int] = (), evaluate: Callable[[int], None] | None = None,
              tick: Callable[..., None] | None = None) -> None:
        """`steps` optimizer steps (the forward under bfloat16 autocast where `bf16`); `on_step(model, k)` after
        step k (0: before the first), `evaluate(k)` at the steps in `at`, `tick(k, status)` with step k's training
        loss (qkinspect.progress)."""
        opt = adamw(self.params, self.opts.lr)
        self.model.train()
        if on_step is not None:
            on_step(self.model, 0)
        if evaluate is not None and 0 in at:
            evaluate(0)
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.opts.seed)  # dropout draws the same masks in the control and the edited run
            for k in range(self.opts.steps):
                t0 = time.perf_counter()
                inputs = _to(self.batches[k % len(self.batches)], self.device)
                with cached(self._forms()):  # the edit's form computed once for the forward and its backward
                    with autocast(self.device, bf16):
                        loss = self.model(**_with_labels(inputs, self.kind)).loss
                    loss.backward()
                    # the module weights this step computed with (read from the cache, not recomputed): every
                    # update is checked by the next step's forward, the last one after the loop
                    self.violation = max(self.violation, self._violation())
                opt.step()
                opt.zero_grad(set_to_none=True)
                self.losses.append(float(loss.detach()))
                if tick is not None:
                    tick(k + 1, status=f"loss {self.losses[-1]:.4f}")
                if k + 1 == self.opts.steps:
                    self.violation = max(self.violation, self._violation())
                sync()
                self.step_seconds.append(time.perf_counter() - t0)  # the step with its constraint check
                if on_step is not None:
                    on_step(self.model, k + 1)
                if evaluate is not None and k + 1 in at:
                    evaluate(k + 1)
        self.model.eval()


def adamw(params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """AdamW without weight decay, its fused kernel (one pass over each parameter and its state) where this torch
    has it for the parameters' device (CPU from torch 2.4), else the multi-tensor one; the same update up to float
    rounding."""
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0, fused=True)
    except (RuntimeError, ValueError):  # no fused kernel for this device in this torch
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0, foreach=True)


def return_freed_memory() -> None:
    """Hand the memory the C allocator holds freed back to the system (glibc's `malloc_trim`; nothing elsewhere).
    Building a healed copy frees many tensors of a few MB between ones it keeps; glibc keeps such holes resident,
    and the training's activations, of other sizes, do not reuse them (on SmolLM2, ~380 MB)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl): nothing to trim
        return


def on_cpu(layer):
    """An AttentionLayer with its tensors on the CPU (a copy only where they are elsewhere)."""
    from dataclasses import fields, replace

    moved = {f.name: getattr(layer, f.name).cpu() for f in fields(layer)
             if isinstance(getattr(layer, f.name), Tensor) and not getattr(layer, f.name).is_cpu}
    return replace(layer, **moved) if moved else layer


def _to(inputs: dict, device: torch.device) -> dict:
    return {k: v.to(device) if isinstance(v, Tensor) else v for k, v in inputs.items()}


def _copy(model: nn.Module, share: bool) -> nn.Module:
    """A copy of `model` to train. With `share` (attention-only healing), its float32 parameters are frozen
    Parameters over the scored model's own memory, not copies: healing puts the projections it trains into modules
    of their own (write_layer, parametrise) and never writes the rest (no optimizer step, no in-place change), so
    the weights it does not train (embeddings, MLPs, norms) are held once, and the scored model's Parameter objects
    (their requires_grad included) are not touched. Other dtypes, inference tensors (which autograd cannot save)
    and buffers are copied (the copy computes in float32)."""
    memo: dict[int, object] = {}
    if share:
        for p in model.parameters():
            if p.dtype == torch.float32 and not p.is_inference() and id(p) not in memo:
                memo[id(p)] = nn.Parameter(p.detach(), requires_grad=False)
    return copy.deepcopy(model, memo)


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


def _steps(progress, name: str, steps: int):
    """The progress of one healing run: its steps, each with its training loss."""
    return phase(progress, name, steps, "steps")


def _tracker(opts: HealOptions, name: str, healer: Healer, tracks: dict[str, str], notes: list[str]):
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
