"""The transformers runtime: a checkpoint loaded with transformers' own classes (never remote code) from the
checked files `guard` stages, with its tokenizer, as an `HFModel`. The families it loads are those the write-back
knows (FAMILIES; the writers are in `writeback`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from qkinspect.errors import CheckpointError, UnsupportedModelError
from qkinspect.loading.boundary import boundary

# model_type -> family of modules the write-back knows
FAMILIES = {"llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "llama", "qwen2_moe": "llama",
            "qwen3": "llama", "qwen3_moe": "llama", "gemma": "llama", "gemma2": "llama", "gemma3_text": "llama",
            "olmo2": "llama", "phi3": "phi3", "gpt_neox": "gpt_neox", "bert": "bert", "roberta": "bert",
            "gpt2": "gpt2"}
CAUSAL, MASKED, DRIFT = "causal", "masked", "drift"


@dataclass
class HFModel:
    """A transformers model in eval mode, what it is measured by, and where its layers are."""

    model: nn.Module
    family: str  # a value of FAMILIES
    kind: str  # CAUSAL, MASKED or DRIFT
    tokenizer: Any
    tokenizer_source: Any = None  # what names the tokenizer in messages (a file, or the GGUF)

    @property
    def layers(self) -> nn.ModuleList:
        base = self.model.base_model
        return base.encoder.layer if self.family == "bert" else base.h if self.family == "gpt2" else base.layers


def family_of(model_type: str) -> str:
    """The write-back family of a model_type; UnsupportedModelError (one line) for the others."""
    if model_type not in FAMILIES:
        known = ", ".join(sorted(FAMILIES))
        raise UnsupportedModelError(f"experiment: model_type {model_type!r} cannot be run and edited yet "
                                    f"(supported: {known}; docs/experiments.md, The model)")
    return FAMILIES[model_type]


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' load reports, warnings and progress bars say nothing the user asked for."""
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:  # as it was: a block inside another leaves the outer one's bars off
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def staged_config(resolved) -> Iterator[tuple[Any, Any]]:
    """The checkpoint staged in its private folder (`guard.staged`) and transformers' config read from it, with
    the values the runner uses checked (`guard.check_config`): no weight is read, so what the config refuses is
    refused before the model is loaded; `load_hf` builds the model from them while the folder is there."""
    from qkinspect.experiment.model import guard

    with quiet_transformers(), guard.staged(resolved) as st, guard.no_gguf_bar(st.gguf):
        yield st, _config(st)


def load_hf(resolved, tokenizer: Any = None, device: str = "cpu", option: str = "tokenizer",
            staged: tuple[Any, Any] | None = None) -> HFModel:
    """Load `resolved` (from `qkinspect.loading.resolve`) with transformers' own classes in float32, eval mode,
    on `device` ("cpu", "cuda", "cuda:N"; checked by the caller).

    Decoders are causal LMs. Encoders are masked LMs when the checkpoint has the head (every head tensor present),
    else bare encoders measured by drift. `tokenizer`: a tokenizer object, or a folder/vocab file to read one
    from; None reads the model's own (its folder, or the GGUF's metadata). transformers reads only checked files,
    from a private folder, and what it raises is translated (`qkinspect.loading.boundary`). `option`: how errors
    name the tokenizer argument (a `Names` entry: "--tokenizer" from the CLI). `staged`: what `staged_config`
    gave, when the caller checked the config first (its folder still there); None stages the checkpoint here.

    Raises:
        UnsupportedModelError: a family the write-back does not know.
        CheckpointError: no tokenizer, or transformers cannot build the model or the tokenizer from the files.
    """
    family = family_of(resolved.config.model_type)
    with contextlib.ExitStack() as stack:
        st, config = staged if staged is not None else stack.enter_context(staged_config(resolved))
        with boundary(st.shown, "transformers cannot build the model from it"):
            model, kind = _load_model(family, st.where, {**st.kw, "config": config}, st.shown)
        tok, tok_shown = load_tokenizer(tokenizer, st, option)
    if len(tok) <= len(set(tok.all_special_ids)):  # transformers builds an empty one from a bare config
        raise CheckpointError(f"{tok_shown}: no tokenizer vocabulary found; "
                              f"name one with {option} (a folder or a vocab.txt)")
    model.eval()
    if device != "cpu":
        model.to(device)
    return HFModel(model, family, kind, tok, tok_shown)


def _config(st) -> Any:
    """The model's config as transformers builds it from the private folder, with the values the runner uses
    checked (`guard.check_config`)."""
    from transformers import AutoConfig

    from qkinspect.experiment.model import guard

    with boundary(st.config_file, "transformers cannot read this config"):
        config = AutoConfig.from_pretrained(st.where, **st.kw)
    guard.check_config(config, st.config_file)
    return config


def _load_model(family: str, where: str, kw: dict[str, Any], shown: Any) -> tuple[nn.Module, str]:
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

    if family != "bert":
        return _complete(AutoModelForCausalLM, where, kw, shown), CAUSAL
    model, info = AutoModelForMaskedLM.from_pretrained(where, dtype=torch.float32, output_loading_info=True, **kw)
    if not info["missing_keys"]:
        return model, MASKED
    del model  # no masked-LM head in the checkpoint: its head would be random
    return _complete(AutoModel, where, kw, shown), DRIFT


def _complete(auto, where: str, kw: dict[str, Any], shown: Any) -> nn.Module:
    """The model, refused when transformers had to fill any of its weights with random values."""
    model, info = auto.from_pretrained(where, dtype=torch.float32, output_loading_info=True, **kw)
    missing = sorted(info["missing_keys"])
    if missing:
        raise CheckpointError(f"{shown}: the checkpoint has no {', '.join(missing[:3])}"
                              f"{' …' if len(missing) > 3 else ''} (a model without its head cannot be measured "
                              "by its loss)")
    return model


def load_tokenizer(tokenizer: Any, st, option: str = "tokenizer") -> tuple[Any, Any]:
    """(the tokenizer, what names it in messages): the object given, a folder or vocab.txt (checked as the
    model's own files are), or the model's own (its folder's files, or the GGUF's metadata). `option` names the
    argument in errors as the caller spells it ("--tokenizer" from the CLI)."""
    from transformers import AutoTokenizer

    from qkinspect.experiment.model import guard

    if tokenizer is not None and not isinstance(tokenizer, (str, bytes)) and not hasattr(tokenizer, "__fspath__"):
        return tokenizer, "the tokenizer given"
    hint = f"; name one with {option} (a folder or a vocab.txt)"
    if tokenizer is None:
        if st.gguf and not st.tokenizer_files:
            raise CheckpointError(f"{st.shown}: no tokenizer in its metadata (tokenizer.ggml.tokens){hint}")
        if not st.tokenizer_files:
            raise CheckpointError(f"{st.shown}: no tokenizer files ({', '.join(guard.TOKENIZER_FILES[:5])} …)"
                                  f"{hint}")
        shown = st.shown if st.gguf else _named(st.tokenizer_files)
        with boundary(shown, "transformers cannot build a tokenizer from it", native=True):
            return AutoTokenizer.from_pretrained(st.where, **st.kw), shown
    from pathlib import Path

    t = Path(tokenizer)
    if t.is_file():  # a WordPiece vocab.txt, one token a line (AntiBERTy ships one beside its model)
        guard.check_vocab(t)
        with boundary(t, "transformers cannot build a WordPiece tokenizer from it",
                            native=True):
            return wordpiece(t, lower_case=False), t
    if not t.is_dir():
        raise CheckpointError(f"{t}: no such file or folder ({option})")
    with guard.staged_tokenizer(t) as (where, files):
        if not files:
            raise CheckpointError(f"{t}: no tokenizer files ({', '.join(guard.TOKENIZER_FILES[:5])} …){hint}")
        shown = _named(files)
        with boundary(shown, "transformers cannot build a tokenizer from it", native=True):
            return AutoTokenizer.from_pretrained(where, local_files_only=True, trust_remote_code=False), shown


def _named(files) -> Any:
    """How messages name a tokenizer read from several files: the main one (tokenizer.json, else vocab.txt ...)
    with the others in parentheses."""
    main = files[0]
    for name in ("tokenizer.json", "vocab.txt", "tokenizer.model", "spiece.model", "vocab.json"):
        if any(f.name == name for f in files):
            main = next(f for f in files if f.name == name)
            break
    others = ", ".join(f.name for f in files if f != main)
    return f"{main} (with {others})" if others else main


def wordpiece(vocab, lower_case: bool = True):
    """A BERT WordPiece tokenizer from a vocab.txt (transformers 5 names the argument `vocab`, 4 `vocab_file`)."""
    import inspect

    from transformers import BertTokenizer

    arg = "vocab" if "vocab" in inspect.signature(BertTokenizer.__init__).parameters else "vocab_file"
    return BertTokenizer(**{arg: str(vocab)}, do_lower_case=lower_case)
