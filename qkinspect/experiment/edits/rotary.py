"""A head's columns as the blocks the rotary gauge keeps apart (docs/experiments.md, "Rotary heads").

RoPE rotates each pair of a head's dimensions by its own frequency. The re-basings W_Q -> W_Q G, W_K -> W_K G⁻ᵀ
that leave the scores unchanged at *every* offset are the G that commute with every rotation: any invertible G on
the dimensions RoPE leaves alone, and on each rotated pair a scaled rotation aI + bJ, i.e. multiplication by the
complex number a + ib (distinct frequencies: pairs never mix). So a rotary head is one real block (the unrotated
dimensions, factors (D, k0)) and one complex block per pair, factor u = W[:, a] + i W[:, b] (D, 1).
A head without RoPE is a single real block of all d dimensions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from qkinspect.errors import InputError
from qkinspect.layer import AttentionLayer


@dataclass(frozen=True)
class RotaryLayout:
    """Which head dimensions form the real block, and the two dimensions of each rotated pair."""

    real: Tensor  # (k0,) unrotated dims
    a: Tensor  # (P,) first dim of each pair
    b: Tensor  # (P,) second dim of each pair

    @property
    def rotary(self) -> bool:
        return self.a.numel() > 0

    def split(self, W: Tensor) -> tuple[Tensor, Tensor]:
        """(n, D, d) real -> real block (n, D, k0), complex blocks (n, P, D, 1): column a + i column b."""
        cplx = torch.complex(W[..., self.a], W[..., self.b])  # (n, D, P)
        return W[..., self.real], cplx.mT.unsqueeze(-1)  # (n, D, P) -> (n, P, D) -> (n, P, D, 1)

    def split_bias(self, b: Tensor) -> tuple[Tensor, Tensor]:
        """(n, d) -> real (n, 1, k0), complex (n, P, 1, 1): the bias is one more input row of the factor."""
        real, cplx = self.split(b.unsqueeze(-2))  # (n, 1, d) -> (n, 1, k0), (n, P, 1, 1)
        return real, cplx

    def merge(self, real: Tensor, cplx: Tensor) -> Tensor:
        """Inverse of `split`: real (n, D, k0) and complex (n, P, D, 1) -> (n, D, d)."""
        c = cplx.squeeze(-1).mT  # (n, P, D, 1) -> (n, D, P)
        n, D = real.shape[0], real.shape[1]
        out = torch.empty(n, D, self.real.numel() + 2 * self.a.numel(), dtype=real.dtype)
        out[..., self.real], out[..., self.a], out[..., self.b] = real, c.real, c.imag
        return out

    def merge_bias(self, real: Tensor, cplx: Tensor) -> Tensor:
        return self.merge(real, cplx)[..., 0, :]  # (n, 1, d) -> (n, d)


def rotary_layout(layer: AttentionLayer, gauge: bool = True) -> RotaryLayout:
    """The layout of `layer`'s heads; one real block when the layer is not rotary or `gauge` is False.

    Rotated dims are the first `rotary_dims` of each head (the last for DeepSeek's MLA, extra["mla"]
    ["rotary_position"] == "last"); `extra["rotary_style"]` pairs them as (i, i + r/2) ("half", Hugging Face's
    rotate_half, the default where an adapter does not say) or (2i, 2i + 1) ("interleaved", GPT-J, Cohere).
    """
    s = layer.spec
    d = s.d_head
    none = torch.empty(0, dtype=torch.int64)
    if s.positional != "rope" or not gauge:
        return RotaryLayout(torch.arange(d), none, none)
    r = s.rotary_dims or d
    if r % 2 or r > d:
        raise InputError(f"{layer.block} layer {layer.layer}: rotary_dims {r} is not an even number <= d_head {d}")
    start = d - r if (layer.extra.get("mla") or {}).get("rotary_position") == "last" else 0
    style = layer.extra.get("rotary_style", "half")
    i = torch.arange(r // 2)
    if style == "half":
        a, b = start + i, start + i + r // 2
    elif style == "interleaved":
        a, b = start + 2 * i, start + 2 * i + 1
    else:
        raise InputError(f"{layer.block} layer {layer.layer}: unknown rotary_style {style!r}")
    rotated = torch.zeros(d, dtype=torch.bool)
    rotated[a], rotated[b] = True, True
    return RotaryLayout(torch.arange(d)[~rotated], a, b)
