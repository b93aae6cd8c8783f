"""Write-back: canonical `AttentionLayer`s into the transformers model's modules, each family's writer built from
the inverse of the layout its adapter reads (qkinspect.loading.adapters: `rows_of_heads` / `out_rows_of_heads`
beside `heads_in` / `heads_out`, `unsectioned` and `uninterleaved_per_head` beside the fused layouts); the round
trip of each is tested (tests/experiment/test_writeback.py).

Families (docs/experiments.md, "The model"): Llama-type decoders (separate q/k/v/o_proj, grouped-query attention
included: Llama, Mistral, Mixtral, Qwen2 and Qwen2-MoE with their q/k/v biases, Qwen3 and Qwen3-MoE, Gemma, Gemma 2
and Gemma 3 with their q/k norms, OLMo2 with its norm over the whole projection), Phi-3 (fused sectioned
`qkv_proj`), GPT-NeoX (fused `query_key_value` interleaved per head), BERT-type encoders (self.query/key/value,
output.dense) and GPT-2 (fused Conv1D `c_attn`, sectioned by columns). A write-back never changes a module in
place: it swaps in new projection modules and returns a function that swaps the originals back, so restoring is
exact.

q/k norms sit between the projection and the score. The edits change the projections only (the form edits are
defined through the norms: `experiment.edits.qknorm`); the norm modules stay the model's own, with one exception:
OLMo2 normalises the whole key projection, so when an edit gives query heads their own keys the key norm's gain is
repeated with them (head h gets its key/value head's gains). That copy changes nothing unedited: the RMS over the
repeated projection equals the RMS over the original one.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from qkinspect.errors import InputError
from qkinspect.experiment.edits.parametrised import CANON, PROBE_BITS, Strided, strided
from qkinspect.experiment.model.runtime import HFModel
from qkinspect.layer import AttentionLayer
from qkinspect.loading.adapters.base import out_rows_of_heads, rows_of_heads
from qkinspect.loading.adapters.fused import uninterleaved_per_head, unsectioned


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


def _blocks(W: Tensor) -> Tensor:
    """(n, D, d) -> (n, d, D): each head's output rows of an nn.Linear [out, in] (the inverse of fused.to_heads)."""
    return W.transpose(1, 2)  # (n, D, d) -> (n, d, D)


def _bias(b: Tensor | None, n: int, d: int, like: Tensor) -> Tensor:
    return torch.zeros(n, d, dtype=like.dtype) if b is None else b


def _out(L: AttentionLayer, like: nn.Module) -> nn.Linear:
    return _linear(out_rows_of_heads(L.W_O), L.b_O, like)  # (H, d, D) -> (D, H*d)


def qk_norm_swaps(attn: nn.Module, L: AttentionLayer) -> dict[str, nn.Module]:
    """OLMo2 (a key norm over the whole projection): the norm for the layer's key/value heads when an edit gave
    query heads their own keys, its gain repeated per query head from the module's own; nothing otherwise."""
    norm = getattr(attn, "k_norm", None)
    weight = getattr(norm, "weight", None)
    s = L.spec
    if weight is None or L.extra.get("qk_norm_scope") != "projection":
        return {}  # per-head norms (Qwen3, Gemma 3) read d values, whatever the number of heads
    groups = weight.numel() // s.d_head
    if groups == s.n_kv_heads:
        return {}
    rep = s.n_heads // groups
    kv = torch.arange(s.n_heads, device=weight.device) // rep  # query head h reads key/value head h // rep
    expanded = copy.deepcopy(norm)
    gains = weight.detach().view(groups, s.d_head)[kv].reshape(-1)  # (G*d,) -> (G, d) -> (H, d) -> (H*d,)
    expanded.weight = nn.Parameter(gains.clone())
    return {"k_norm": expanded}


def write_phi3(block: nn.Module, L: AttentionLayer) -> Callable[[], None]:
    """Phi-3: qkv_proj rows sectioned [q (H*d) | k (G*d) | v (G*d)], o_proj; the module reads its key/value
    head count from `num_key_value_heads` when it splits the rows."""
    a = block.self_attn
    s = L.spec
    H, G, d = s.n_heads, s.n_kv_heads, s.d_head
    weight = unsectioned(*(_blocks(W) for W in (L.W_Q, L.W_K, L.W_V)))  # (H*d + 2*G*d, D): [q | k | v]
    biases = (L.b_Q, L.b_K, L.b_V)
    bias = None if all(b is None for b in biases) else unsectioned(
        *(_bias(b, n, d, L.W_Q) for b, n in zip(biases, (H, G, G), strict=True)))
    return _swap(a, {"qkv_proj": _linear(weight, bias, a.qkv_proj), "o_proj": _out(L, a.o_proj),
                     "num_key_value_heads": G, "num_key_value_groups": H // G})


def write_gpt_neox(block: nn.Module, L: AttentionLayer) -> Callable[[], None]:
    """GPT-NeoX: query_key_value rows interleaved per head (head, [q, k, v], d), dense."""
    a = block.attention
    s = L.spec
    H, d = s.n_heads, s.d_head
    if s.n_kv_heads != H:
        raise ValueError(f"layer {L.layer}: GPT-NeoX has one key/value head per query head, not {s.n_kv_heads}")
    weight = uninterleaved_per_head(*(_blocks(W) for W in (L.W_Q, L.W_K, L.W_V)))  # (H*3*d, D): (head, 3, d)
    biases = (L.b_Q, L.b_K, L.b_V)
    bias = None if all(b is None for b in biases) else uninterleaved_per_head(
        *(_bias(b, H, d, L.W_Q) for b in biases))  # (H*3*d,)
    return _swap(a, {"query_key_value": _linear(weight, bias, a.query_key_value),
                     "dense": _out(L, a.dense)})


def _write_llama(block: nn.Module, L: AttentionLayer) -> Callable[[], None]:
    a = block.self_attn
    s = L.spec
    return _swap(a, {
        **qk_norm_swaps(a, L),
        "q_proj": _linear(rows_of_heads(L.W_Q), _flat(L.b_Q), a.q_proj),
        "k_proj": _linear(rows_of_heads(L.W_K), _flat(L.b_K), a.k_proj),
        "v_proj": _linear(rows_of_heads(L.W_V), _flat(L.b_V), a.v_proj),
        "o_proj": _linear(out_rows_of_heads(L.W_O), L.b_O, a.o_proj),
        "num_key_value_groups": s.n_heads // s.n_kv_heads,
    })


def _write_bert(block: nn.Module, L: AttentionLayer) -> Callable[[], None]:
    sa, out = block.attention.self, block.attention.output
    undo_self = _swap(sa, {
        "query": _linear(rows_of_heads(L.W_Q), _flat(L.b_Q), sa.query),
        "key": _linear(rows_of_heads(L.W_K), _flat(L.b_K), sa.key),
        "value": _linear(rows_of_heads(L.W_V), _flat(L.b_V), sa.value),
    })
    undo_out = _swap(out, {"dense": _linear(out_rows_of_heads(L.W_O), L.b_O, out.dense)})

    def undo() -> None:
        undo_self()
        undo_out()

    return undo


def _write_gpt2(block: nn.Module, L: AttentionLayer) -> Callable[[], None]:
    a = block.attn
    H, G, d = L.spec.n_heads, L.spec.n_kv_heads, L.spec.d_head
    # Conv1D stores [in, out]: the sectioned rows [q | k | v] of an nn.Linear, transposed
    weight = unsectioned(*(_blocks(W) for W in (L.W_Q, L.W_K, L.W_V))).T  # (H*d + 2*G*d, D) -> (D, ...)
    b = unsectioned(*(_bias(b, n, d, L.W_Q) for b, n in zip((L.b_Q, L.b_K, L.b_V), (H, G, G), strict=True)))
    b_O = L.b_O if L.b_O is not None else torch.zeros(L.spec.d_model, dtype=L.W_O.dtype)
    return _swap(a, {
        "c_attn": _conv1d(weight, b, a.c_attn),
        "c_proj": _conv1d(L.W_O.reshape(H * d, L.spec.d_model), b_O, a.c_proj),  # (H, d, D) -> [in, out]
    })


WRITERS = {"llama": _write_llama, "bert": _write_bert, "gpt2": _write_gpt2, "phi3": write_phi3,
           "gpt_neox": write_gpt_neox}


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
    return WRITERS[hf.family](hf.layers[i], layer)


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


# -- where the canonical tensors land in the family's modules ---------------------------------------------------


def module_maps(hf, layer: AttentionLayer) -> dict[str, Tensor | Strided]:
    """For each parameter the write-back puts into layer `layer.layer`'s block (by its name in the block), the
    index of the canonical element (in `EditForm.flat` order) each of its elements holds, -1 where none; a
    `Strided` placement instead where the parameter is one canonical tensor with permuted axes.

    Raises:
        InputError: the family's write-back does not place each canonical element once, unchanged.
    """
    names = [n for n in CANON if getattr(layer, n) is not None]
    sizes = [getattr(layer, n).numel() for n in names]
    total = sum(sizes)
    passes = max(1, math.ceil(math.log2(total + 1) / PROBE_BITS))
    block = hf.layers[layer.layer]
    maps: dict[str, Tensor] = {}
    for p in range(passes):
        ids = torch.arange(total, dtype=torch.int64)
        digit = ((ids >> (PROBE_BITS * p)) & ((1 << PROBE_BITS) - 1)) + 1  # 1..4096: 0 means "not canonical"
        parts = torch.split(digit.to(torch.float32), sizes)
        probe = replace(layer, **{n: part.view(getattr(layer, n).shape) for n, part in zip(names, parts,
                                                                                            strict=True)})
        before = {id(t) for t in block.parameters()}
        undo = write_layer(hf, probe)
        try:
            for name, t in block.named_parameters():
                if id(t) in before:
                    continue
                v = t.detach().to("cpu", torch.float64)
                if not bool((v == v.round()).all()) or float(v.min()) < 0 or float(v.max()) > 1 << PROBE_BITS:
                    raise InputError(f"healing: the {hf.family} write-back changes values ({name}); it cannot "
                                     "keep an edit as a parametrisation")
                got = v.to(torch.int64) - 1
                prev = maps.get(name)
                maps[name] = got << (PROBE_BITS * p) if prev is None else torch.where(
                    (prev >= 0) & (got >= 0), prev + (got << (PROBE_BITS * p)), torch.full_like(prev, -1))
        finally:
            undo()
    placed = torch.cat([m[m >= 0] for m in maps.values()]) if maps else torch.empty(0, dtype=torch.int64)
    if placed.numel() != total or not torch.equal(placed.sort().values, torch.arange(total)):
        raise InputError(f"healing: the {hf.family} write-back does not place every attention weight once")
    small = torch.int32 if total < 2**31 else torch.int64  # half the memory: the maps live as long as the healing
    shapes = {}  # the canonical tensor starting at each offset: its shape
    offset = 0
    for n, size in zip(names, sizes, strict=True):
        shapes[offset] = tuple(getattr(layer, n).shape)
        offset += size
    return {name: strided(m, shapes) or m.to(small) for name, m in maps.items()}
