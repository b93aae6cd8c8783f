"""What an experiment is asked to do, checked once, before any model is loaded: the edits, the scope, the rotary
choice, the amounts (`tokens`, `window`, `probes`, `verify`), healing's options, the device; then, from the model's
description alone (its config: no weight is read), the selection and whether each edit is defined for its layers.
Torch-free, so that a bad value is refused at once.

Errors name each option as the caller spells it (`qkinspect.names.Names`): the library's argument names by default
(`tokens=1`), the CLI's options when the CLI passes `CLI_NAMES` (`--tokens 1`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qkinspect.errors import InputError
from qkinspect.experiment.edits.names import Edit, parse_edit
from qkinspect.names import Names

if TYPE_CHECKING:
    from qkinspect.layer import ModelInfo

SCOPES = ("head", "layer", "model")  # scope
ROTARY = ("gauge", "offset0")  # rotary
MAX_TOKENS = 1 << 24  # tokens and window: at most this many (16,777,216)
BYTES_PER_TOKEN = 64  # text read for N tokens: its first 64·N bytes (at least 1 MiB, at most 64 MiB)
MAX_PROBES = 4096
TRAIN = ("attention", "all")  # heal's train
TRAINED = {"attention": "the attention projections (q, k, v, o) of every layer", "all": "every parameter"}


@dataclass(frozen=True)
class Text:
    """A text to measure or heal on (`scoring.default_text`, `scoring.read_text`)."""

    name: str  # how the output names it
    text: str


# How the caller names each option in errors, in the one names type: `run_experiment`'s arguments by default (healing's
# as fields of `heal`), the CLI's options (`--heal-batch`) when the CLI passes CLI_NAMES.
LIBRARY_NAMES = Names(edit="edits", heal_train="heal.train", heal_lr="heal.lr", heal_batch="heal.batch_tokens",
                      heal_text="heal.text", heal_eval_every="heal.eval_every", heal_float32="heal.float32",
                      heal_track="heal.track", heal_track_every="heal.track_every")
CLI_NAMES = Names.cli()


@dataclass(frozen=True)
class HealOptions:
    """How to heal: `steps` AdamW steps at `lr` (constant, no weight decay) on batches of about `batch_tokens`
    tokens of `text` (a `Text`, a file read once the request is checked, or None: the scored text after the
    scored tokens), training `train` ("attention" or "all").
    `track`: a folder for the metric trajectories during healing (one sweep folder per run), measured every
    `track_every` steps. `eval_every`: score the edited runs and the control every this many steps (and at the
    last; None: at the last only). `float32`: train in float32 even where bfloat16 autocast would be used."""

    steps: int
    train: str = "attention"
    lr: float = 1e-4
    text: Text | str | Path | None = None
    batch_tokens: int = 1024
    track: Path | None = None
    track_every: int = 10
    seed: int = 0
    eval_every: int | None = None
    float32: bool = False

    def check(self, names: Names = LIBRARY_NAMES) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise InputError(f"{names.said('heal', self.steps)}: the number of fine-tuning steps must be at least 1")
        if self.train not in TRAIN:
            raise InputError(f"{names.said('heal_train', self.train)}: expected one of {', '.join(TRAIN)}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise InputError(f"{names.said('heal_lr', self.lr)}: the learning rate must be a positive number")
        if self.batch_tokens < 2 or self.track_every < 1:
            raise InputError(f"{names.heal_batch} must be at least 2 and the tracking interval at least 1")
        if self.eval_every is not None and (isinstance(self.eval_every, bool) or not isinstance(self.eval_every, int)
                                            or self.eval_every < 1):
            raise InputError(f"{names.said('heal_eval_every', self.eval_every)}: the evaluation interval must be "
                             "at least 1 step")


HEAL_ONLY = {  # HealOptions' fields a caller may give beside the steps: (its name in Names, what it would do)
    "train": ("heal_train", "train"), "lr": ("heal_lr", "train"), "batch_tokens": ("heal_batch", "train on"),
    "text": ("heal_text", "train on"), "track": ("heal_track", "track"), "track_every": ("heal_track_every", "track"),
    "eval_every": ("heal_eval_every", "evaluate"), "float32": ("heal_float32", "train"),
}


def heal_options(steps: int | None, names: Names = LIBRARY_NAMES, **options: Any) -> HealOptions | None:
    """The healing a caller asked for: HealOptions(steps, **options), or None when `steps` is 0 or None (no
    healing). A healing option given without steps would do nothing, so it is refused (InputError naming it as
    the caller spells it, e.g. "--heal-eval-every 10: ... needs --heal N"); an option at its default is not
    "given". The CLI passes its --heal-* options here.

    Example:
        >>> heal_options(0) is None
        True
        >>> heal_options(50, eval_every=10).eval_every
        10
    """
    if steps:
        return HealOptions(steps=steps, **options)
    defaults = {f.name: f.default for f in fields(HealOptions)}
    for name, value in options.items():
        if name in HEAL_ONLY and value != defaults[name]:
            option, verb = HEAL_ONLY[name]
            given = getattr(names, option) if value is True else names.said(option, value)  # a flag: its name
            raise InputError(f"{given}: without healing ({names.heal} N fine-tuning steps) "
                             f"there is nothing to {verb}; add {names.heal} or leave it out")
    return None


@dataclass(frozen=True)
class ExperimentRequest:
    """A checked request: the edits (each once, in order), the number of heads to verify (0 without an
    estimate), the healing options (None: no healing) and the device's name (None: where the model is)."""

    edits: tuple[Edit, ...]
    verify: int
    heal: HealOptions | None
    device: str | None


def check_request(edits: str | Sequence[str], *, scope: str, rotary: str, tokens: int, window: int,
                  estimate: bool, probes: int | None, verify: int | None, heal: int | HealOptions | None,
                  device: str | None, seed: int = 0, default_verify: int = 12,
                  names: Names = LIBRARY_NAMES) -> ExperimentRequest:
    """Every option that can be checked without the model, in one place; InputError naming the first bad one as
    the caller spells it (`names`)."""
    chosen = parse_edits(edits, names)
    if scope not in SCOPES:
        raise InputError(f"{names.said('scope', scope)}: expected one of {', '.join(SCOPES)}")
    if rotary not in ROTARY:
        raise InputError(f"{names.said('rotary', rotary)}: expected gauge or offset0")
    check_amounts(tokens, window, names)
    check_estimate(scope, estimate, probes, verify, names)
    opts = heal if isinstance(heal, HealOptions) or not heal else HealOptions(steps=heal, seed=seed)
    if opts:
        opts.check(names)
        if estimate:
            raise InputError(f"{names.heal} runs every edit exactly: it cannot be combined with {names.estimate}")
        if rotary != "gauge":
            raise InputError(f"{names.heal} keeps edits in the rotary gauge; use {names.said('rotary', 'gauge')}")
    where = None
    if device is not None:
        from qkinspect.device import check_device

        where = check_device(device, names.device)
    verified = (default_verify if estimate else 0) if verify is None else verify
    return ExperimentRequest(tuple(chosen), verified, opts or None, where)


def check_amounts(tokens: int, window: int, names: Names = LIBRARY_NAMES) -> None:
    """InputError unless 2 <= tokens, window <= MAX_TOKENS."""
    if tokens < 2 or window < 2:
        raise InputError(f"{names.said('tokens', tokens)} / {names.said('window', window)}: both must be at least 2")
    for option, value in (("tokens", tokens), ("window", window)):
        if value > MAX_TOKENS:
            raise InputError(f"{names.said(option, value)}: at most {MAX_TOKENS} (2**24) tokens")


def check_window(config: Any, window: int, names: Names = LIBRARY_NAMES) -> None:
    """InputError when `window` is longer than the positions the model's transformers `config` says it takes
    (max_position_embeddings, where it says): from the staged checkpoint's config before any weight is read
    (`run.open_experiment`), and again from the loaded model's when the windows are cut (`scoring.windows`; a model
    in memory). Not from qkinspect's light config (qkinspect.loading.config): most families leave this value to
    transformers, which would read the checkpoint's config.json unstaged."""
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int) and not isinstance(limit, bool) and 0 < limit < window:
        raise InputError(f"{names.said('window', window)}: this model takes at most {limit} positions")


def check_estimate(scope: str, estimate: bool, probes: int | None, verify: int | None,
                   names: Names = LIBRARY_NAMES) -> None:
    if estimate and scope != "head":
        raise InputError(f"{names.estimate} estimates heads one by one: use it with {names.said('scope', 'head')}, "
                         f"not {scope}")
    if not estimate and (verify or probes is not None):
        raise InputError(f"{names.verify if verify else names.probes} applies to {names.estimate} only")
    if probes is not None and not 2 <= probes <= MAX_PROBES:
        raise InputError(f"{names.said('probes', probes)}: expected 2 to {MAX_PROBES} (the curvature term's "
                         "standard error needs two)")
    if verify is not None and verify < 0:
        raise InputError(f"{names.said('verify', verify)}: expected a number of heads, 0 or more")


def parse_edits(edits: str | Sequence[str], names: Names = LIBRARY_NAMES) -> list[Edit]:
    """The edits asked for ("share_qk,rank:8" or a list of edit texts), each once, in order."""
    texts = edits.split(",") if isinstance(edits, str) else list(edits)
    out = list(dict.fromkeys(parse_edit(t) for t in texts if t.strip()))
    if not out:
        raise InputError(f"{names.edit}: name at least one edit")
    return out


def check_model(info: ModelInfo, edits: Sequence[Edit], layers: Sequence[int] | None, heads: Sequence[int] | None,
                names: Names = LIBRARY_NAMES, scope: str | None = None) -> None:
    """What the model's description (its config: no weight is read) already refuses: a model with more than one
    self-attention block, layers or heads it does not have, a model_type the runtime cannot run and edit, and an
    edit its layers cannot take (`qkinspect.experiment.edits.apply.check_edit`; through q/k norms, what their
    form, known from the model_type's adapter, cannot define for the heads `scope` edits together:
    `qkinspect.experiment.edits.qknorm.check_form`), named on the first chosen layer as the run would name it.
    `scope` None: the heads edited together are not known, and only the layers check them."""
    from qkinspect.errors import UnsupportedModelError
    from qkinspect.selection import check_selection

    if len(info.blocks) != 1 or info.blocks[0].name not in ("encoder", "decoder"):
        keys = ", ".join(b.key for b in info.blocks)
        raise UnsupportedModelError(f"{info.source}: experiment runs models with one self-attention block; "
                                    f"this one has {keys}")
    (spec,) = check_selection(info, None, layers, heads, options=("", names.layers, names.heads))
    from qkinspect.experiment.edits.apply import check_edit
    from qkinspect.experiment.edits.qknorm import check_form
    from qkinspect.experiment.model.runtime import family_of

    family_of(info.model_type)
    where = f"{spec.key} layer {min(layers) if layers else 0}"
    norms = qk_norm_form(info.model_type) if spec.qk_norm else None
    every_head = spec.n_heads == 1 or (scope in ("layer", "model")
                                       and (heads is None or set(heads) == set(range(spec.n_heads))))
    for edit in edits:
        check_edit(spec, edit, where)
        if norms is not None:
            check_form(where, edit.name, *norms, every_head=every_head or scope is None,
                       together=f" ({names.said('scope', 'layer')})")


def qk_norm_form(model_type: str) -> tuple[str, str] | None:
    """The q/k norms' kind ("rmsnorm" or "layernorm") and scope ("head", or "projection": one RMS over every
    head, OLMo2) of a model_type's layers, as its adapter reads them; None where the adapter does not say."""
    from qkinspect.loading.adapters.registry import adapter_for

    adapter = adapter_for(model_type)
    kind, scope = getattr(adapter, "qk_norm_kind", None), getattr(adapter, "qk_norm_scope", None)
    return (kind, scope) if isinstance(kind, str) and isinstance(scope, str) else None


Request = ExperimentRequest  # its name before requests were named <Capability>Request (kept: users import it)
