"""Shared machinery for adapter proofs: build a tiny model, save it, load it through qkinspect,
and compare the canonical matrices with the model's own projections captured in a real forward pass."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from qkinspect.layer import AttentionLayer
from qkinspect.loading import open_model

ATOL = 1e-5


def save_tiny(model: torch.nn.Module, path: Path) -> Path:
    """Save a randomly initialised model (float32, safetensors) and return its folder."""
    model.eval()
    model.save_pretrained(path, safe_serialization=True)
    return path


def load_layers(path: Path) -> list[AttentionLayer]:
    with open_model(path) as m:
        return list(m.layers())


@contextlib.contextmanager
def capture(*modules: torch.nn.Module):
    """Record (inputs, output) of each module's forward calls: `records[i]` is a list of (args, kwargs, output)."""
    records: list[list] = [[] for _ in modules]
    handles = []
    for i, mod in enumerate(modules):
        def hook(m, args, kwargs, out, i=i):
            records[i].append((args, kwargs, out))
        handles.append(mod.register_forward_hook(hook, with_kwargs=True))
    try:
        yield records
    finally:
        for h in handles:
            h.remove()


def per_head(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x (..., D) through canonical W (n, D, d) and b (n, d) -> (..., n, d)."""
    y = torch.einsum("...m,nmd->...nd", x, W)
    return y if b is None else y + b


def assert_heads(x: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None, expected: torch.Tensor, what: str = ""):
    """Compare x projected per head with the model's own states `expected` (..., n, d)."""
    got = per_head(x.double(), W.double(), None if b is None else b.double())
    exp = expected.double()
    assert got.shape == exp.shape, f"{what}: shape {tuple(got.shape)} != model's {tuple(exp.shape)}"
    err = (got - exp).abs().max().item()
    assert err <= ATOL, f"{what}: max abs error {err:.3g} > {ATOL}"


def split_heads(y: torch.Tensor, n: int, d: int) -> torch.Tensor:
    """(..., n*d) -> (..., n, d): the model's own per-head split for head-major layouts."""
    return y.reshape(*y.shape[:-1], n, d)


# -- helpers added for the decoder-only adapter proofs -------------------------------------------------


def randomize(model: torch.nn.Module, seed: int = 0, std: float = 0.2) -> torch.nn.Module:
    """Overwrite every parameter with N(0, std) noise (norm gains: 1 + noise) so that biases, gains and
    q/k-norm weights are not the identity and attention probabilities are far from uniform."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=p.dtype) * std
            is_gain = p.ndim == 1 and ("norm" in name or "ln" in name) and name.endswith("weight")
            p.copy_(noise + 1 if is_gain else noise)
    return model.eval()


def apply_norm(norm, y: torch.Tensor, eps: float) -> torch.Tensor:
    """Apply a canonical `Norm` record (qkinspect.layer.Norm) to y (..., D), in float64."""
    y = y.double()
    if norm.kind == "layernorm":
        y = y - y.mean(-1, keepdim=True)
        out = y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + eps) * norm.gain.double()
        return out if norm.bias is None else out + norm.bias.double()
    return y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + eps) * norm.gain.double()


def assert_close(got: torch.Tensor, expected: torch.Tensor, what: str = "", atol: float = ATOL) -> None:
    got, exp = got.double(), expected.double()
    assert got.shape == exp.shape, f"{what}: shape {tuple(got.shape)} != model's {tuple(exp.shape)}"
    err = (got - exp).abs().max().item()
    assert err <= atol, f"{what}: max abs error {err:.3g} > {atol}"


def output_proj(z: torch.Tensor, W_O: torch.Tensor, b_O: torch.Tensor | None) -> torch.Tensor:
    """Per-head attention outputs z (..., H, dv) through canonical W_O (H, dv, D) and b_O (D,) -> (..., D)."""
    y = torch.einsum("...hd,hdm->...m", z.double(), W_O.double())
    return y if b_O is None else y + b_O.double()
