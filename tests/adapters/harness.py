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
