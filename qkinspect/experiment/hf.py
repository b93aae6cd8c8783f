"""The one place where model code runs: a checkpoint loaded with transformers' own classes (never remote code),
and canonical `AttentionLayer`s written back into its modules (the inverse of qkinspect's adapters).

Families whose write-back is proven (tests/experiment/test_run.py, test_writeback.py): Llama-type decoders
(separate q/k/v/o_proj, grouped-query attention included: Llama, Mistral, Mixtral, Qwen2 and Qwen2-MoE with their
q/k/v biases, Qwen3 and Qwen3-MoE, Gemma, Gemma 2 and Gemma 3 with their q/k norms, OLMo2 with its norm over the
whole projection), Phi-3 (fused sectioned qkv_proj), GPT-NeoX (fused query_key_value interleaved per head), BERT-type
encoders (self.query/key/value, output.dense) and GPT-2 (fused Conv1D c_attn); the newer families' writers are in
`writeback`. A write-back never changes a module in place: it swaps in new projection modules and returns a
function that swaps the originals back, so restoring is exact.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from qkinspect.errors import CheckpointError, UnsupportedModelError
from qkinspect.layer import AttentionLayer

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
def _quiet_transformers() -> Iterator[None]:
    """transformers' load reports, warnings and progress bars say nothing the user asked for."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        hf_logging.enable_progress_bar()


def load_hf(resolved, tokenizer: Any = None) -> HFModel:
    """Load `resolved` (from `qkinspect.loading.resolve`) with transformers' own classes in float32, eval mode.

    Decoders are causal LMs. Encoders are masked LMs when the checkpoint has the head (every head tensor present),
    else bare encoders measured by drift. `tokenizer`: a tokenizer object, or a folder/vocab file to read one
    from; None reads the model's own (its folder, or the GGUF's metadata). transformers reads only checked files,
    from a private folder, and what it raises is translated (`qkinspect.experiment.hf_guard`).

    Raises:
        UnsupportedModelError: a family the write-back does not know.
        CheckpointError: no tokenizer, or transformers cannot build the model or the tokenizer from the files.
    """
    from qkinspect.experiment import hf_guard as guard

    family = family_of(resolved.config.model_type)
    with _quiet_transformers(), guard.staged(resolved) as st, guard.no_gguf_bar(st.gguf):
        config = _config(st)
        with guard.boundary(st.shown, "transformers cannot build the model from it"):
            model, kind = _load_model(family, st.where, {**st.kw, "config": config,
                                                         "attn_implementation": guard.ATTENTION}, st.shown)
        tok, tok_shown = _tokenizer(tokenizer, st)
    if len(tok) <= len(set(tok.all_special_ids)):  # transformers builds an empty one from a bare config
        raise CheckpointError(f"{tok_shown}: no tokenizer vocabulary found; "
                              "name one with --tokenizer (a folder or a vocab.txt)")
    model.eval()
    return HFModel(model, family, kind, tok, tok_shown)


def _config(st) -> Any:
    """The model's config as transformers builds it from the private folder, with the values the runner uses
    checked (`hf_guard.check_config`)."""
    from transformers import AutoConfig

    from qkinspect.experiment import hf_guard as guard

    with guard.boundary(st.config_file, "transformers cannot read this config"):
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


def _tokenizer(tokenizer: Any, st) -> tuple[Any, Any]:
    """(the tokenizer, what names it in messages): the object given, a --tokenizer folder or vocab.txt (checked
    as the model's own files are), or the model's own (its folder's files, or the GGUF's metadata)."""
    from transformers import AutoTokenizer

    from qkinspect.experiment import hf_guard as guard

    if tokenizer is not None and not isinstance(tokenizer, (str, bytes)) and not hasattr(tokenizer, "__fspath__"):
        return tokenizer, "the tokenizer given"
    hint = "; name one with --tokenizer (a folder or a vocab.txt)"
    if tokenizer is None:
        if not st.gguf and not st.tokenizer_files:
            raise CheckpointError(f"{st.shown}: no tokenizer files ({', '.join(guard.TOKENIZER_FILES[:5])} …)"
                                  f"{hint}")
        shown = st.shown if st.gguf else _named(st.tokenizer_files)
        with guard.boundary(shown, "transformers cannot build a tokenizer from it"):
            return AutoTokenizer.from_pretrained(st.where, **st.kw), shown
    from pathlib import Path

    t = Path(tokenizer)
    if t.is_file():  # a WordPiece vocab.txt, one token a line (AntiBERTy ships one beside its model)
        guard.check_vocab(t)
        with guard.boundary(t, "transformers cannot build a WordPiece tokenizer from it"):
            return wordpiece(t, lower_case=False), t
    if not t.is_dir():
        raise CheckpointError(f"{t}: no such file or folder (--tokenizer)")
    with guard.staged_tokenizer(t) as (where, files):
        if not files:
            raise CheckpointError(f"{t}: no tokenizer files ({', '.join(guard.TOKENIZER_FILES[:5])} …){hint}")
        shown = _named(files)
        with guard.boundary(shown, "transformers cannot build a tokenizer from it"):
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


# -- write-back: canonical tensors -> the family's modules ---------------------------------------------------


def _rows(W: Tensor) -> Tensor:
    """(n, D, d) -> nn.Linear weight (n*d, D) [out, in]: the inverse of adapters.base.heads_in."""
    n, D, d = W.shape
    return W.transpose(1, 2).reshape(n * d, D)  # (n, D, d) -> (n, d, D) -> (n*d, D)


def _out_rows(W_O: Tensor) -> Tensor:
    """(H, d, D) -> nn.Linear weight (D, H*d): the inverse of adapters.base.heads_out."""
    H, d, D = W_O.shape
    return W_O.reshape(H * d, D).T  # (H*d, D) -> (D, H*d)


def _flat(b: Tensor | None) -> Tensor | None:
    return None if b is None else b.reshape(-1)  # (n, d) -> (n*d,)


def _linear(weight: Tensor, bias: Tensor | None, like: nn.Module) -> nn.Linear:
    """A new nn.Linear holding `weight` [out, in] and `bias`, on `like`'s device and dtype."""
    p = like.weight
    out, inp = weight.shape
    m = nn.Linear(inp, out, bias=bias is not None, device=p.device, dtype=p.dtype)
    with torch.no_grad():
        m.weight.copy_(weight)
        if bias is not None:
            m.bias.copy_(bias)
    return m


def _conv1d(weight: Tensor, bias: Tensor, like: nn.Module) -> nn.Module:
    """A new GPT-2 Conv1D holding `weight` [in, out] and `bias`."""
    from transformers.pytorch_utils import Conv1D

    nx, nf = weight.shape
    m = Conv1D(nf, nx).to(device=like.weight.device, dtype=like.weight.dtype)
    with torch.no_grad():
        m.weight.copy_(weight)
        m.bias.copy_(bias)
    return m


def _swap(module: nn.Module, new: dict[str, Any]) -> Callable[[], None]:
    """Set `module`'s attributes (submodules or plain values) to `new`; return what restores the old ones."""
    old = {name: getattr(module, name) for name in new}
    for name, value in new.items():
        setattr(module, name, value)

    def restore() -> None:
        for name, value in old.items():
            setattr(module, name, value)

    return restore


def write_layer(hf: HFModel, layer: AttentionLayer) -> Callable[[], None]:
    """Put `layer`'s tensors into the model's attention module of the same index; returns the undo.

    Llama-type: a layer whose K/V were expanded (spec.n_kv_heads grown to n_heads) gets k_proj/v_proj with more
    output rows and the module's `num_key_value_groups` to match.

    Example:
        >>> undo = write_layer(hf, edited_layer)  # doctest: +SKIP
        >>> ...; undo()  # the model is exactly as before
    """
    i = layer.layer
    if not 0 <= i < len(hf.layers):
        raise ValueError(f"layer {i} is not in the model (0..{len(hf.layers) - 1})")
    from qkinspect.experiment.writeback import WRITERS

    writers = {"llama": _write_llama, "bert": _write_bert, "gpt2": _write_gpt2, **WRITERS}
    return writers[hf.family](hf.layers[i], layer)


def _write_llama(block: nn.Module, L: AttentionLayer) -> Callable[[], None]:
    from qkinspect.experiment.writeback import qk_norm_swaps

    a = block.self_attn
    s = L.spec
    return _swap(a, {
        **qk_norm_swaps(a, L),
        "q_proj": _linear(_rows(L.W_Q), _flat(L.b_Q), a.q_proj),
        "k_proj": _linear(_rows(L.W_K), _flat(L.b_K), a.k_proj),
        "v_proj": _linear(_rows(L.W_V), _flat(L.b_V), a.v_proj),
        "o_proj": _linear(_out_rows(L.W_O), L.b_O, a.o_proj),
        "num_key_value_groups": s.n_heads // s.n_kv_heads,
    })


def _write_bert(block: nn.Module, L: AttentionLayer) -> Callable[[], None]:
    sa, out = block.attention.self, block.attention.output
    undo_self = _swap(sa, {
        "query": _linear(_rows(L.W_Q), _flat(L.b_Q), sa.query),
        "key": _linear(_rows(L.W_K), _flat(L.b_K), sa.key),
        "value": _linear(_rows(L.W_V), _flat(L.b_V), sa.value),
    })
    undo_out = _swap(out, {"dense": _linear(_out_rows(L.W_O), L.b_O, out.dense)})

    def undo() -> None:
        undo_self()
        undo_out()

    return undo


def _write_gpt2(block: nn.Module, L: AttentionLayer) -> Callable[[], None]:
    a = block.attn
    H, d = L.spec.n_heads, L.spec.d_head

    def cols(W: Tensor) -> Tensor:
        n, D, dd = W.shape
        return W.permute(1, 0, 2).reshape(D, n * dd)  # (n, D, d) -> (D, n, d) -> (D, n*d): Conv1D [in, out]

    def bias(b: Tensor | None, n: int) -> Tensor:
        return torch.zeros(n * d, dtype=L.W_Q.dtype) if b is None else b.reshape(-1)

    weight = torch.cat([cols(L.W_Q), cols(L.W_K), cols(L.W_V)], dim=1)  # (D, 3*H*d): sectioned [q | k | v]
    b = torch.cat([bias(L.b_Q, H), bias(L.b_K, L.spec.n_kv_heads), bias(L.b_V, L.spec.n_kv_heads)])
    b_O = L.b_O if L.b_O is not None else torch.zeros(L.spec.d_model, dtype=L.W_O.dtype)
    return _swap(a, {
        "c_attn": _conv1d(weight, b, a.c_attn),
        "c_proj": _conv1d(L.W_O.reshape(H * d, L.spec.d_model), b_O, a.c_proj),  # (H, d, D) -> [in, out]
    })


@contextlib.contextmanager
def written(hf: HFModel, layers: list[AttentionLayer]) -> Iterator[None]:
    """The model with `layers` written back for the duration of the block; restored exactly afterwards."""
    undo: list[Callable[[], None]] = []
    try:
        for layer in layers:
            undo.append(write_layer(hf, layer))
        yield
    finally:
        for u in reversed(undo):
            u()
