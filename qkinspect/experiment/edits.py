"""Head edits: pure functions from an `AttentionLayer` to an edited copy (docs/experiments.md, "Edits")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from qkinspect.errors import InputError
from qkinspect.layer import AttentionLayer

EDITS = ("share_qk", "tie_q", "tie_k", "symmetric", "rank", "share_qkv", "ablate")


class EditError(InputError):
    """An edit that is misspelt, or not defined for this layer (exit code 2)."""


@dataclass(frozen=True)
class Edit:
    """One edit: its name, and K for `rank:K`."""

    name: str
    k: int | None = None

    def __str__(self) -> str:
        return self.name if self.k is None else f"{self.name}:{self.k}"


@dataclass(frozen=True)
class EditResult:
    """An edited copy of a layer (same canonical layout), and what predicts each edited head's cost."""

    layer: AttentionLayer
    offset0_only: bool
    predicted: dict[int, float]
    details: dict[int, dict[str, float]] = field(default_factory=dict)


def parse_edit(text: str) -> Edit:
    """`"rank:8"` -> Edit("rank", 8); raises EditError on anything else than the names in EDITS."""
    name, sep, arg = text.strip().partition(":")
    if name not in EDITS:
        raise EditError(f"unknown edit {text!r}; expected one of {', '.join(EDITS)} (rank as rank:K)")
    if name == "rank":
        if not sep or not arg.isdigit():
            raise EditError(f"edit {text!r}: rank takes a whole number of dimensions, e.g. rank:8")
        return Edit(name, int(arg))
    if sep:
        raise EditError(f"edit {text!r}: {name} takes no argument")
    return Edit(name)


def expand_kv(layer: AttentionLayer) -> AttentionLayer:
    """The same layer with one key/value head per query head (head h gets a copy of KV head h // group)."""
    s = layer.spec
    if s.n_kv_heads == s.n_heads:
        return layer
    kv = layer.kv_index()
    k_norm = layer.k_norm
    if k_norm is not None and k_norm.dim() == 2:
        k_norm = k_norm[kv]
    take = lambda t: None if t is None else t[kv].clone()  # noqa: E731
    return replace(layer, spec=replace(s, n_kv_heads=s.n_heads), W_K=take(layer.W_K), W_V=take(layer.W_V),
                   b_K=take(layer.b_K), b_V=take(layer.b_V), k_norm=k_norm, extra=dict(layer.extra))


def apply_edit(layer: AttentionLayer, edit: Edit, heads: Sequence[int] | None = None) -> EditResult:
    """The layer with `edit` applied to `heads` (all heads when None); the input is never mutated."""
    raise EditError(f"edit {edit} is not implemented yet")
