"""Constraints with no edit of a trained model behind them, kept as forms on a transformers model the same way
(docs/twin.md): parametrisations of the module weights, and attention functions registered through transformers'
public `AttentionInterface`, never model code of our own.

- share_qk_reformer: share_qk's form (`parametrised.EditForm`) plus the Reformer's attention (Kitaev et al. 2020,
  §2.2): keys unit-normalised per head, and a position does not attend to itself unless nothing else is visible.
- share_kv: W_K := W_V per head (keys are values; the literature's Q-K=V), b_K := b_V where the layer has biases:
  llama's k_proj reads v_proj's weight, GPT-2's fused c_attn reads its value block into its key block.
- wq_identity: W_Q := I (each head's query is its slice of the normed residual stream), no query weights.
- bilinear: one full d_model × d_model W_QK per head, scores x_i W x_jᵀ (x the attention's input), values and
  outputs as standard; W starts as the standard twin's W_Q W_Kᵀ. Rotary positions act on queries and keys, which
  this form has not: under llama it has no positional signal but the causal mask. No transformers class holds it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from qkinspect.errors import InputError

REFORMER = "qkinspect_reformer"
BILINEAR = "qkinspect_bilinear"


def visible(mask: Tensor | None, T: int, S: int, device) -> Tensor:
    """Which key positions each query may see, (B|1, H|1, T, S) bool, from the mask transformers passes (None:
    causal; bool: as is; additive floats: where 0)."""
    if mask is None:
        return torch.ones(T, S, dtype=torch.bool, device=device).tril(S - T)[None, None]
    if mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2


def without_self(allowed: Tensor) -> Tensor:
    """`allowed` with each query's own position removed where the query sees another position (the Reformer's
    self mask; the last T of S keys are the queries')."""
    T, S = allowed.shape[-2:]
    eye = torch.ones(T, S, dtype=torch.bool, device=allowed.device).tril(S - T) & \
        ~torch.ones(T, S, dtype=torch.bool, device=allowed.device).tril(S - T - 1)  # key j == query i
    others = (allowed & ~eye).any(-1, keepdim=True)  # (B, H, T, 1)
    return allowed & ~(eye & others)


def _attend(module, scores: Tensor, value: Tensor, allowed: Tensor, dropout: float) -> tuple[Tensor, Tensor]:
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(value.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    rep = weights.shape[1] // value.shape[1]
    v = value.repeat_interleave(rep, dim=1) if rep > 1 else value  # query head h reads value head h // rep
    return (weights @ v).transpose(1, 2).contiguous(), weights  # (B, H, T, S) @ (B, H, S, d) -> (B, T, H, d)


def reformer_attention(module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                       scaling: float | None = None, dropout: float = 0.0, **kwargs) -> tuple[Tensor, Tensor]:
    """The Reformer's shared-QK attention on (B, H, T, d) queries and (B, Hkv, S, d) keys and values."""
    scaling = 1 / math.sqrt(query.shape[-1]) if scaling is None else scaling
    k = key / key.norm(dim=-1, keepdim=True).clamp_min(1e-6)  # unit keys: a query's score is its length × cos
    rep = query.shape[1] // k.shape[1]
    k = k.repeat_interleave(rep, dim=1) if rep > 1 else k
    scores = (query @ k.transpose(-2, -1)) * scaling  # (B, H, T, S)
    allowed = without_self(visible(attention_mask, query.shape[-2], k.shape[-2], query.device))
    return _attend(module, scores, value, allowed, dropout)


def bilinear_attention(module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                       scaling: float | None = None, dropout: float = 0.0, **kwargs) -> tuple[Tensor, Tensor]:
    """Scores x_i W_h x_jᵀ from the attention's input x (`module.qk_input`, kept by `bilinear`'s hook) and
    `module.qk` (H, D, D); queries and keys are not read."""
    x = module.qk_input  # (B, T, D)
    scaling = 1 / math.sqrt(value.shape[-1]) if scaling is None else scaling
    xw = x.unsqueeze(1) @ module.qk  # (B, 1, T, D) @ (H, D, D) -> (B, H, T, D)
    scores = (xw @ x.transpose(-2, -1).unsqueeze(1)) * scaling  # (B, H, T, D) @ (B, 1, D, T) -> (B, H, T, T)
    allowed = visible(attention_mask, x.shape[1], x.shape[1], x.device)
    return _attend(module, scores, value, allowed, dropout)


def register_attention() -> None:
    """Register the two attention functions with transformers (idempotent; each worker process calls it)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask

    AttentionInterface.register(REFORMER, reformer_attention)
    AttentionInterface.register(BILINEAR, bilinear_attention)
    AttentionMaskInterface.register(REFORMER, eager_mask)
    AttentionMaskInterface.register(BILINEAR, eager_mask)


def use_reformer_attention(model: nn.Module) -> None:
    register_attention()
    model.set_attn_implementation(REFORMER)


class Pinned(nn.Module):
    """A module weight with the elements where `mask` is set held at `value` (a parametrisation)."""

    def __init__(self, mask: Tensor, value: Tensor):
        super().__init__()
        self.register_buffer("mask", mask)
        self.register_buffer("value", value)

    def forward(self, X: Tensor) -> Tensor:
        if X.numel() == 0:  # every element pinned: the original was emptied (`_pin`)
            return self.value.to(X.dtype)
        return torch.where(self.mask, self.value.to(X.dtype), X)


@dataclass
class Held:
    """What a form pinned: `pinned` trainable elements held fixed (not free parameters), `violation()` the largest
    departure of the module weights from the form now, `note` where a transformers class cannot hold it."""

    pinned: int
    violation: object
    note: str | None = None


def _pin(module: nn.Module, attr: str, mask: Tensor, value: Tensor) -> int:
    """Hold `module.attr` at `value` where `mask`; returns the trainable elements pinned (0 where the whole weight
    is: its original is emptied and frozen, as `parametrised.parametrise` does)."""
    parametrize.register_parametrization(module, attr, Pinned(mask, value))
    original = module.parametrizations[attr].original
    if bool(mask.all()):
        original.requires_grad_(False)
        original.data = original.data.new_empty(0)
        return 0
    return int(mask.sum())


def _projections(hf) -> list[tuple[nn.Module, int, int]]:
    """(attention module, n_heads, d_head) per layer."""
    out = []
    for block in hf.layers:
        attn = block.attn if hf.family == "gpt2" else block.self_attn
        n = hf.model.config.num_attention_heads
        out.append((attn, n, attn.head_dim))
    return out


def pin_query_identity(hf) -> Held:
    """W_Q := I on every layer (llama's q_proj, the query block of GPT-2's fused c_attn, its bias 0)."""
    pinned, checks = 0, []
    for attn, n, d in _projections(hf):
        D = hf.model.config.hidden_size
        if n * d != D:
            raise InputError(f"wq_identity needs heads × head size = d_model ({n} × {d} ≠ {D})")
        eye = torch.eye(D, device=next(attn.parameters()).device)
        if hf.family == "gpt2":  # Conv1D stores [in, out]: the query block is the first D output columns
            w = attn.c_attn.weight
            mask = torch.zeros_like(w, dtype=torch.bool)
            mask[:, :D] = True
            value = torch.zeros_like(w)
            value[:, :D] = eye
            pinned += _pin(attn.c_attn, "weight", mask, value)
            bmask = torch.zeros_like(attn.c_attn.bias, dtype=torch.bool)
            bmask[:D] = True
            pinned += _pin(attn.c_attn, "bias", bmask, torch.zeros_like(attn.c_attn.bias))
            checks.append(lambda a=attn, D=D, eye=eye: (a.c_attn.weight[:, :D] - eye).abs().max())
        else:
            if attn.q_proj.bias is not None:
                pinned += _pin(attn.q_proj, "bias", torch.ones_like(attn.q_proj.bias, dtype=torch.bool),
                               torch.zeros_like(attn.q_proj.bias))
            pinned += _pin(attn.q_proj, "weight", torch.ones_like(attn.q_proj.weight, dtype=torch.bool), eye)
            checks.append(lambda a=attn, eye=eye: (a.q_proj.weight - eye).abs().max())
    return Held(pinned, lambda: _worst(checks))


class ReadFrom(nn.Module):
    """A module weight that is another module's (`source.attr`): its own original is emptied and not trained. The
    source is held outside the module tree, so its parameter is registered once, where it lives."""

    def __init__(self, source: nn.Module, attr: str):
        super().__init__()
        self.__dict__["source"] = source
        self.attr = attr

    def forward(self, X: Tensor) -> Tensor:
        return getattr(self.__dict__["source"], self.attr)


class CopyBlock(nn.Module):
    """A fused weight whose last-axis block `dst` is read from its block `src` (GPT-2's c_attn: the key columns
    are the value columns); the elements of `dst` in the original are not read."""

    def __init__(self, src: tuple[int, int], dst: tuple[int, int]):
        super().__init__()
        self.src, self.dst = src, dst

    def forward(self, X: Tensor) -> Tensor:
        (a, b), (c, d) = self.src, self.dst
        return torch.cat([X[..., :c], X[..., a:b], X[..., d:]], -1)


def share_keys_values(hf, init: str = "draw") -> Held:
    """W_K := W_V per head on every layer (b_K := b_V where there are biases). `init`: draw keeps the standard
    draw's W_V as the one matrix, nearest puts (W_K + W_V)/2, the one matrix nearest to both."""
    pinned, checks = 0, []
    for attn, _, _ in _projections(hf):
        if hf.family == "gpt2":  # Conv1D stores [in, out]: query, key, value blocks of D output columns
            D = attn.c_attn.weight.shape[0]
            for attr in ("weight", "bias"):
                t = getattr(attn.c_attn, attr)
                if init == "nearest":
                    with torch.no_grad():
                        t[..., 2 * D:] = (t[..., D:2 * D] + t[..., 2 * D:]) / 2
                parametrize.register_parametrization(attn.c_attn, attr, CopyBlock((2 * D, 3 * D), (D, 2 * D)))
                pinned += t[..., D:2 * D].numel()  # the original's key block: held, never read
            checks.append(lambda a=attn, D=D: _apart(a.c_attn.weight[:, D:2 * D], a.c_attn.weight[:, 2 * D:]))
            continue
        for attr in ("weight", "bias"):
            k, v = getattr(attn.k_proj, attr, None), getattr(attn.v_proj, attr, None)
            if k is None or v is None:
                continue
            if init == "nearest":
                with torch.no_grad():
                    v.copy_((k + v) / 2)
            parametrize.register_parametrization(attn.k_proj, attr, ReadFrom(attn.v_proj, attr))
            original = attn.k_proj.parametrizations[attr].original
            original.requires_grad_(False)
            original.data = original.data.new_empty(0)
        checks.append(lambda a=attn: _apart(a.k_proj.weight, a.v_proj.weight))
    return Held(pinned, lambda: _worst(checks))


def _apart(W_K: Tensor, W_V: Tensor) -> Tensor:
    """The largest |W_K − W_V| relative to W_V's largest element."""
    return (W_K - W_V).abs().max() / W_V.abs().max().clamp_min(1e-30)


def _worst(checks) -> float:
    with torch.no_grad():
        return float(torch.stack([c().float() for c in checks]).max()) if checks else 0.0


def bilinear(hf) -> Held:
    """One W_QK (H, D, D) per layer, from the standard twin's W_Q W_Kᵀ; the query and key projections pinned at 0
    (not read) and the bilinear attention function set."""
    from qkinspect.loading import open_model

    register_attention()
    with open_model(hf.model) as source:
        key = source.info.blocks[0].key
        layers = [source.layer(key, i) for i in range(len(hf.layers))]
    pinned = 0
    for (attn, _, _), layer in zip(_projections(hf), layers, strict=True):
        Wq, Wk = layer.W_Q.float(), layer.W_K[layer.kv_index()].float()  # (H, D, d) each
        attn.qk = nn.Parameter((Wq @ Wk.transpose(-2, -1)).to(next(attn.parameters()).device))  # (H, D, D)
        attn.register_forward_pre_hook(_keep_input, with_kwargs=True)
        D = Wq.shape[1]
        if hf.family == "gpt2":
            w, b = attn.c_attn.weight, attn.c_attn.bias
            mask = torch.zeros_like(w, dtype=torch.bool)
            mask[:, :2 * D] = True
            pinned += _pin(attn.c_attn, "weight", mask, torch.zeros_like(w))
            bmask = torch.zeros_like(b, dtype=torch.bool)
            bmask[:2 * D] = True
            pinned += _pin(attn.c_attn, "bias", bmask, torch.zeros_like(b))
        else:
            for proj in (attn.q_proj, attn.k_proj):
                for attr in ("weight", "bias"):
                    t = getattr(proj, attr, None)
                    if t is not None:
                        pinned += _pin(proj, attr, torch.ones_like(t, dtype=torch.bool), torch.zeros_like(t))
                proj.forward = _Zeros(proj.out_features)  # its weight is 0 and its output not read: no matmul
    hf.model.set_attn_implementation(BILINEAR)
    return Held(pinned, lambda: 0.0, note="a transformers class has no d_model × d_model W_QK per head: the "
                "tensors are saved as model.safetensors (qk: (heads, d_model, d_model) per layer) with the config, "
                "and analyze cannot read them")


class _Zeros:
    """A projection's forward whose weight is pinned at 0: zeros of its output's shape."""

    def __init__(self, width: int):
        self.width = width

    def __call__(self, x: Tensor) -> Tensor:
        return x.new_zeros(*x.shape[:-1], self.width)


def _keep_input(module: nn.Module, args: tuple, kwargs: dict):
    x = kwargs.get("hidden_states", args[0] if args else None)
    module.__dict__["qk_input"] = x
    return None
