"""Experiments on a model in memory (docs/experiments.md, "Models in memory").

The user's own transformers model is run and edited in place: the write-back swaps in new projection modules and
swaps the originals back (qkinspect.experiment.model.writeback), so after the experiment every parameter is the
same object with the same values, bit for bit. While it runs, the model is in eval mode; each module's training
flag is restored afterwards. A (config, state_dict) pair is built into the family's transformers class with the
state dict's own tensors (`load_state_dict(assign=True)`: not copied, never written to).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from torch import nn

from qkinspect.errors import CheckpointError, InputError
from qkinspect.experiment.model.runtime import (
    CAUSAL,
    DRIFT,
    MASKED,
    HFModel,
    family_of,
    load_tokenizer,
    quiet_transformers,
)


def hf_in_memory(resolved, tokenizer: Any = None) -> HFModel:
    """The HFModel of an in-memory model (from `qkinspect.loading.in_memory.resolve_memory`).

    Its measure follows its class: *ForCausalLM / *LMHeadModel: next-token loss; *ForMaskedLM: masked-LM loss;
    a bare encoder or decoder: drift. `tokenizer`: a tokenizer object, or a folder / vocab.txt; None reads the one
    in the folder `config.name_or_path` names, where that is a local folder.

    Raises:
        InputError: no tokenizer can be found; UnsupportedModelError: a family the write-back does not know.
    """
    family = family_of(resolved.config.model_type)
    model = resolved.model if resolved.model is not None else _built(resolved, family)
    tok = _memory_tokenizer(tokenizer, resolved)
    if len(tok) <= len(set(tok.all_special_ids)):
        raise InputError(f"{tokenizer or resolved.name}: no tokenizer vocabulary found; pass tokenizer=")
    return HFModel(model, family, _kind(model), tok)


def _kind(model: nn.Module) -> str:
    name = type(model).__name__
    if name.endswith(("ForCausalLM", "LMHeadModel")):
        return CAUSAL
    if name.endswith("ForMaskedLM"):
        return MASKED
    return DRIFT


def _memory_tokenizer(tokenizer: Any, resolved) -> Any:
    if tokenizer is None:
        named = str(getattr(resolved.config, "name_or_path", "") or "")
        if not (named and Path(named).is_dir()):
            raise InputError(f"{resolved.origin}: a model in memory needs tokenizer= (a tokenizer, or a folder or "
                             "vocab.txt to read one from)")
        tokenizer = Path(named)
    with quiet_transformers():
        return load_tokenizer(tokenizer, None)[0]  # never None here: the model's own files are not read


def _built(resolved, family: str) -> nn.Module:
    """A (config, state_dict) pair as the family's transformers model, holding the state dict's own tensors: the
    LM-head class where the state dict has every tensor of it, else the bare model (measured by drift)."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

    state = resolved.source.tensors
    head = AutoModelForMaskedLM if family == "bert" else AutoModelForCausalLM
    for auto in (head, AutoModel):
        with quiet_transformers():
            try:
                model = auto.from_config(resolved.config)
            except (ValueError, KeyError, TypeError) as e:
                raise CheckpointError(f"{resolved.origin}: transformers cannot build this config ({e})") from None
        missing = _assigned(model, state)
        if not missing:
            return model
    raise CheckpointError(f"{resolved.origin}: the state dict lacks {', '.join(sorted(missing)[:3])} (give "
                          "model.state_dict() of the model whose config this is)")


def _assigned(model: nn.Module, state: dict) -> list[str]:
    """Load `state` into `model` by assignment (no copy); the model's tensors still missing after tying weights."""
    result = model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    given = {t.untyped_storage().data_ptr() for t in state.values()}
    own = dict(model.state_dict())
    return [k for k in result.missing_keys if own[k].untyped_storage().data_ptr() not in given]


@contextlib.contextmanager
def eval_mode(model: Any) -> Iterator[None]:
    """`model` (an nn.Module; anything else passes through) in eval mode for the block, each module's training
    flag restored afterwards."""
    if not isinstance(model, nn.Module):
        yield
        return
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in flags:
            m.training = training


def keeps_mode(run: Callable) -> Callable:
    """Decorator for `run_experiment(model, ...)`: an in-memory model runs in eval mode and gets its modules'
    training flags back afterwards."""

    @functools.wraps(run)
    def wrapper(model=None, *args, **kwargs):
        with eval_mode(model):
            return run(model, *args, **kwargs)

    return wrapper
