"""The twins' models: transformers' own classes built from a config (never model code of our own), each
constraint put on a random initialisation as the parametrised form healing keeps (one code path).

`build(variant, shape, vocab, seed)` draws the standard twin's initial tensors from `seed` and puts the variant's
constraint on them: the edits' forms through `qkinspect.experiment.heal.Healer` (share_qk, symmetric, share_qkv,
rank:K), and the forms that have no edit beside them (`qkinspect.experiment.edits.scratch`: the Reformer's
attention, W_Q = I, one bilinear W_QK per head). Every tensor the constraint does not touch is the standard twin's,
bit for bit; a matched arm (`share_qk+params`) copies the standard twin's tensors into the leading block of its
wider (or narrower) MLP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from qkinspect.errors import InputError
from qkinspect.names import Names
from qkinspect.twin.request import LIBRARY_NAMES, MATCHED, Shape, base_variant

MAX_CONFIG_BYTES = 1 << 20  # a config.json larger than this is not a model's config
EDITED = ("share_qk", "share_qk_reformer", "symmetric", "share_qkv", "rank")  # constraints held by an edit's form
# the query-side tensor each tied parameter starts from under init="draw" (the form derives W_Q from W_K)
_FROM_QUERY = {"W_K": "W_Q", "b_K": "b_Q"}


@dataclass
class Built:
    """A twin ready to train: the transformers model, the parameters to train, the forms holding the constraint
    (`forms`: what `parametrised.cached` takes), `violation()` the largest departure from it now, and `params`
    the number of free parameters."""

    model: nn.Module
    trained: list[nn.Parameter]
    forms: list
    violation: Any
    params: int
    family: str
    note: str | None = None  # what its checkpoint does not carry (the Reformer's attention), or why no class holds it
    plain: bool = True  # whether its class holds the trained twin (not bilinear)
    init: str = "draw"  # its start: the standard draw in the form, or the nearest form to it (module docstring)


def config_for(shape: Shape, vocab: int, intermediate: int | None = None, names: Names = LIBRARY_NAMES):
    """The transformers config of the standard twin (no dropout), from the sizes or from `shape.config`."""
    from transformers import GPT2Config, LlamaConfig

    if shape.config is not None:
        cfg = _from_file(shape.config, names)
    elif shape.arch == "gpt2":
        cfg = GPT2Config(vocab_size=vocab, n_embd=shape.d_model, n_layer=shape.layers, n_head=shape.heads,
                         n_positions=shape.context, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         bos_token_id=None, eos_token_id=None)
    else:
        mlp = 16 * math.ceil(8 * shape.d_model / 3 / 16)  # SwiGLU's 8/3 d_model, a multiple of 16
        cfg = LlamaConfig(vocab_size=vocab, hidden_size=shape.d_model, intermediate_size=mlp,
                          num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                          num_key_value_heads=shape.heads, max_position_embeddings=shape.context,
                          tie_word_embeddings=False, attention_dropout=0.0)
    cfg.vocab_size = vocab
    cfg.bos_token_id = cfg.eos_token_id = None  # the twins' tokenizers have neither
    if intermediate is not None:
        setattr(cfg, "n_inner" if cfg.model_type == "gpt2" else "intermediate_size", intermediate)
    return cfg


def _from_file(path: Path, names: Names):
    from transformers import GPT2Config, LlamaConfig

    from qkinspect.reading import read_json

    try:
        doc = read_json(path, what="a config", limit=MAX_CONFIG_BYTES)
    except InputError as e:  # the reader's line, naming the file as the caller's option
        raise InputError(f"{names.said('config', path)}: {str(e).removeprefix(f'{path}: ')}") from None
    kind = doc.get("model_type") if isinstance(doc, dict) else None
    classes = {"llama": LlamaConfig, "gpt2": GPT2Config}
    if kind not in classes:
        raise InputError(f"{names.said('config', path)}: model_type must be llama or gpt2 (got {kind!r})")
    doc = {k: v for k, v in doc.items() if k not in ("architectures", "auto_map", "torch_dtype", "dtype")}
    try:
        cfg = classes[kind](**doc)
    except (TypeError, ValueError) as e:
        raise InputError(f"{names.said('config', path)}: transformers refuses it ({e})") from None
    for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout"):
        if hasattr(cfg, k):
            setattr(cfg, k, 0.0)
    return cfg


def mlp_width(cfg) -> int:
    if cfg.model_type == "gpt2":
        return cfg.n_inner or 4 * cfg.n_embd
    return cfg.intermediate_size


def standard_model(cfg, seed: int) -> nn.Module:
    """The standard twin's model, its initial tensors drawn from `seed` (transformers' own initialisation)."""
    from transformers import AutoModelForCausalLM

    from qkinspect.experiment.edits.scratch import register_attention
    from qkinspect.experiment.model.runtime import quiet_transformers

    register_attention()
    with quiet_transformers(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    return model.float()


def build(variant: str, shape: Shape, vocab: int, seed: int, device: str = "cpu", init: str = "draw") -> Built:
    """The twin of `variant` for `seed`, on `device`, ready to train, started as `init` says (draw or nearest)."""
    cfg = config_for(shape, vocab)
    std = standard_model(cfg, seed)
    if variant.endswith(MATCHED):
        std = matched(variant, cfg, std, shape, vocab, seed, init)
    return constrain(base_variant(variant), variant, std, device, init)


def start_of(kind: str, init: str) -> str:
    """The start a twin of constraint `kind` has when `init` is asked: draw or nearest (module docstring)."""
    if kind in ("standard", "wq_identity", "bilinear"):
        return "draw"
    return "nearest" if kind == "rank" else init


def constrain(kind: str, variant: str, model: nn.Module, device: str, init: str = "draw") -> Built:
    """`model` (its initial tensors) with the constraint `kind` kept as a parametrisation, started as `init` says."""
    from qkinspect.experiment.edits.names import parse_edit
    from qkinspect.experiment.edits.parametrised import cached, canonical_from
    from qkinspect.experiment.edits.scratch import (
        bilinear,
        pin_query_identity,
        share_keys_values,
        use_reformer_attention,
    )
    from qkinspect.experiment.heal import Healer
    from qkinspect.experiment.model.runtime import CAUSAL, FAMILIES, HFModel
    from qkinspect.experiment.requests import HealOptions

    family = FAMILIES[model.config.model_type]
    model = model.to(device)
    hf = HFModel(model, family, CAUSAL, None)
    n_layers = len(hf.layers)
    start = start_of(kind, init)
    if kind in EDITED:
        edit = parse_edit("share_qk" if kind == "share_qk_reformer" else variant.removesuffix(MATCHED))
        heads = list(range(model.config.num_attention_heads))
        drawn = _canonical(model) if start == "draw" else None
        outputs = [layer.W_O.detach().clone() for layer in _canonical(model)] if kind == "share_qkv" else None
        healer = Healer(hf, {i: (edit, heads) for i in range(n_layers)}, HealOptions(steps=1, train="all"), [],
                        "gauge")
        note = None
        if kind == "share_qk_reformer":
            use_reformer_attention(healer.model)
            note = ("the Reformer's key normalisation and self mask are its attention function's, not the weights': "
                    "a transformers class runs the saved share_qk weights as standard attention")
        forms = [f for f, _ in healer.forms.values()]
        if outputs is not None:  # the edit refits W_O to a trained W_V it replaces; a twin keeps its initial W_O
            for form, W_O in zip(forms, outputs, strict=True):
                _set_free(form, "W_O", W_O)
        if drawn is not None:
            for form, layer in zip(forms, drawn, strict=True):
                _start_from_draw(form, layer)

        def violation() -> float:
            with torch.no_grad(), cached(forms):
                v = [form.violation(canonical_from(healer.hf.layers[i], maps, form, healer.whole[i]))
                     for i, (form, maps) in healer.forms.items()]
            return float(torch.stack([x.float() for x in v]).max())

        return Built(healer.model, healer.params, forms, violation, _count(healer.params) - _held(forms), family,
                     note, init=start)
    if kind == "share_kv":
        free = share_keys_values(hf, start)
        return Built(model, _trained(model), [], free.violation, _count(_trained(model)) - free.pinned, family,
                     init=start)
    if kind == "wq_identity":
        free = pin_query_identity(hf)
        return Built(model, _trained(model), [], free.violation, _count(_trained(model)) - free.pinned, family)
    if kind == "bilinear":
        free = bilinear(hf)
        return Built(model, _trained(model), [], free.violation, _count(_trained(model)) - free.pinned, family,
                     note=free.note, plain=False)
    trained = _trained(model)
    return Built(model, trained, [], lambda: 0.0, _count(trained), family)


def _canonical(model: nn.Module) -> list:
    """Each layer's canonical tensors (an AttentionLayer: W_Q, W_K, W_V (H, D, d), W_O, biases) as the model has
    them now, on the CPU."""
    from qkinspect.experiment.heal import on_cpu
    from qkinspect.loading import open_model

    with open_model(model) as source:
        key = source.info.blocks[0].key
        return [on_cpu(source.layer(key, i)) for i in range(source.info.blocks[0].n_layers)]


def _start_from_draw(form, layer) -> None:
    """Put the standard draw `layer` into a tie's form: each free tensor the draw's own, the key the draw's query
    (times the fixed signs under symmetric, so the form's W_Q = W_K diag(s) is the draw's W_Q)."""
    signs = form.signs if form.kind == "symmetric" else None
    from qkinspect.experiment.edits.parametrised import CANON

    for name in [n for n in form._parameters if n in CANON]:
        if f"take_{name}" in form._buffers:  # a group's shared key or value: the draw's rows already
            continue
        value = getattr(layer, _FROM_QUERY.get(name, name)).detach().to(torch.float32)
        if signs is not None and name in _FROM_QUERY:
            value = value * (signs.unsqueeze(-2) if name == "W_K" else signs).to(value.device)
        _set_free(form, name, value.to(getattr(form, name).device))


def _set_free(form, name: str, value: Tensor) -> None:
    """Write canonical `value` into the form's parameter `name`, in the axis order the form stores it."""
    p = getattr(form, name)
    perm = form.perm.get(name)
    with torch.no_grad():
        p.copy_(value.permute(perm) if perm is not None else value)


def _trained(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def _count(params: list[nn.Parameter]) -> int:
    return sum(p.numel() for p in params)


def _held(forms) -> int:
    """The elements of the forms' parameters that the constraint holds still: the optimizer carries them, but no
    loss reaches them, so they are no free parameters (docs/twin.md). A rank form's W_Q outside the rotary pairs it
    keeps (its real block is the factor pair A C), the factors' columns beyond a head's kept directions, and W_K's
    columns of the rotary pairs dropped (a pair's score is zero whatever its key holds)."""
    held = 0
    for form in forms:
        if form.kind != "rank":
            continue
        _, D, d = form.shapes["W_Q"]
        kept = int(form.kept_dirs.sum())
        pairs = form.free_cols.clone()  # (edited heads, d): 1 on the rotary columns kept
        pairs[:, form.real_cols] = 1  # the real block is the factors': its W_K columns stay free
        held += len(form.heads) * D * d - int(form.free_cols.sum()) * D  # W_Q: the kept pairs' columns alone
        held += int((1 - pairs).sum()) * D  # W_K: the dropped pairs' columns
        held += form.A.numel() - kept * D  # A (n, D, kmax): the kept directions' columns
        held += form.C.numel() - kept * form.C.shape[-1]  # C (n, kmax, k0): the kept directions' rows
    return held


def matched(variant: str, cfg, std: nn.Module, shape: Shape, vocab: int, seed: int, init: str = "draw") -> nn.Module:
    """The standard model with its MLP widened (or narrowed) so that the constrained arm `variant` has the standard
    twin's free parameters within 1 %: the standard tensors in the leading block of each, the rest drawn from
    `seed` as the wider model's own initialisation."""
    base = variant.removesuffix(MATCHED)
    saved = _count(_trained(std)) - constrain(base_variant(base), base, standard_model(cfg, seed), "cpu", init).params
    per = (3 if cfg.model_type != "gpt2" else 2) * (cfg.hidden_size if cfg.model_type != "gpt2" else cfg.n_embd)
    per += 1 if cfg.model_type == "gpt2" else 0  # the MLP's first bias
    width = max(1, mlp_width(cfg) + round(saved / (per * cfg.num_hidden_layers)))
    wide = standard_model(config_for(shape, vocab, width), seed)
    with torch.no_grad():
        held = dict(std.named_parameters())
        for name, p in wide.named_parameters():
            q = held[name]
            common = tuple(slice(0, min(a, b)) for a, b in zip(p.shape, q.shape, strict=True))
            p[common] = q[common]
    return wide


def state_tensors(model: nn.Module) -> dict[str, Tensor]:
    """The trained twin's tensors under its class's names, each parametrised weight read through its form (the
    constraint applied), float32 on the CPU: what its class's `save_pretrained` writes."""
    out: dict[str, Tensor] = {}
    with torch.no_grad():
        for key, value in model.state_dict().items():
            if ".parametrizations." in key:
                path, _, rest = key.partition(".parametrizations.")
                key = f"{path}.{rest.split('.')[0]}"
                if key in out:
                    continue
                value = getattr(model.get_submodule(path), rest.split(".")[0])
            out[key] = value.detach().to("cpu", torch.float32).clone()
    return out


def plain_copy(cfg, tensors: dict[str, Tensor]) -> nn.Module:
    """A plain model of the twin's class (standard attention) holding `tensors`, every key checked."""
    import copy

    from transformers import AutoModelForCausalLM

    from qkinspect.experiment.model.runtime import quiet_transformers

    cfg = copy.deepcopy(cfg)
    with quiet_transformers():
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    model.load_state_dict(tensors, strict=True)
    return model
