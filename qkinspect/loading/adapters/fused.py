"""Fused q/k/v projections: each stored layout as a named reshape, and the adapter base that uses them.

A fused weight stacks the q, k and v output rows of one nn.Linear ([out, in]; GPT-2's Conv1D stores the
transpose). The layouts split those rows; each function works on any tensor whose first dimension is the rows,
so the same reshape serves the weight (rows, D) and the bias (rows,). They return per-head row blocks
(n, d, ...); `to_heads` turns a weight's blocks into the canonical (n, D, d). Beside each layout the write-back
uses, its inverse (`unsectioned`, `uninterleaved_per_head`: qkinspect.experiment.model.writeback). No @register here.

| layout | rows | families |
|---|---|---|
| sectioned | [q (H*d) . k (G*d) . v (G*d)] | GPT-2, MPT, Phi-3, old multi-query Falcon (G = 1) |
| interleaved per head | (head, 3, d) | GPT-NeoX, BLOOM, old multi-head Falcon |
| interleaved per KV group | (group, rep+2, d): rep query heads, then k, then v | Falcon new_decoder_architecture |
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from qkinspect.layer import AttentionLayer
from qkinspect.loading.adapters._decoder import DecoderAdapter, norm_from
from qkinspect.loading.adapters.base import heads_out

if TYPE_CHECKING:
    from torch import Tensor

Blocks = tuple["Tensor", "Tensor", "Tensor"]


def sectioned(w: Tensor, H: int, G: int, d: int) -> Blocks:
    """[q | k | v] rows: (H*d + 2*G*d, ...) -> q (H, d, ...), k (G, d, ...), v (G, d, ...)."""
    q, k, v = w.split([H * d, G * d, G * d])  # (H*d, ...), (G*d, ...), (G*d, ...)
    return q.unflatten(0, (H, d)), k.unflatten(0, (G, d)), v.unflatten(0, (G, d))


def unsectioned(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The inverse of `sectioned`: q (H, d, ...), k (G, d, ...), v (G, d, ...) -> [q | k | v] rows
    (H*d + 2*G*d, ...)."""
    import torch  # the adapters stay torch-free at import: the loader picks one before torch is needed

    return torch.cat([q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)])  # (n, d, ...) -> (n*d, ...), stacked


def interleaved_per_head(w: Tensor, H: int, d: int) -> Blocks:
    """(head, 3, d) rows: (H*3*d, ...) -> q, k, v each (H, d, ...)."""
    t = w.unflatten(0, (H, 3, d))  # (H*3*d, ...) -> (H, 3, d, ...)
    return t[:, 0], t[:, 1], t[:, 2]


def uninterleaved_per_head(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The inverse of `interleaved_per_head`: q, k, v each (H, d, ...) -> (head, 3, d) rows (H*3*d, ...)."""
    import torch

    return torch.stack([q, k, v], 1).flatten(0, 2)  # 3 x (H, d, ...) -> (H, 3, d, ...) -> (H*3*d, ...)


def interleaved_per_group(w: Tensor, G: int, rep: int, d: int) -> Blocks:
    """(group, rep+2, d) rows: (G*(rep+2)*d, ...) -> q (G*rep, d, ...), k (G, d, ...), v (G, d, ...).

    Query head h = g*rep + r is the r-th query of group g, so it reads key/value head g = h // rep.
    """
    t = w.unflatten(0, (G, rep + 2, d))  # (G*(rep+2)*d, ...) -> (G, rep+2, d, ...)
    q = t[:, :rep].flatten(0, 1)  # (G, rep, d, ...) -> (G*rep, d, ...)
    return q, t[:, rep], t[:, rep + 1]


def to_heads(blocks: Tensor) -> Tensor:
    """A weight's per-head row blocks (n, d, D) -> canonical (n, D, d)."""
    return blocks.transpose(1, 2)  # (n, d, D) -> (n, D, d)


class FusedQKVAdapter(DecoderAdapter):
    """One fused nn.Linear for q/k/v plus an output projection. Subclasses set the paths and `layout`."""

    layer_path = "h.{i}"
    attn_path = "self_attention"
    qkv_name = "query_key_value"
    out_name = "dense"
    norm_path: str | None = "input_layernorm"
    norm_kind = "layernorm"
    required_roles = ("qkv", "o")

    def layout(self, w: Tensor) -> Blocks:
        """Split the fused rows of `w` (weight or bias) into q, k, v per-head blocks."""
        raise NotImplementedError

    def qkv_rows(self) -> int:
        s = self._spec
        return (s.n_heads + 2 * s.n_kv_heads) * s.d_head

    def names(self, layer: int) -> dict[str, str]:
        lp = self.layer_path.format(i=layer)
        p = f"{lp}.{self.attn_path}"
        n = {"qkv": f"{p}.{self.qkv_name}.weight", "o": f"{p}.{self.out_name}.weight",
             "bqkv": f"{p}.{self.qkv_name}.bias", "bo": f"{p}.{self.out_name}.bias"}
        return {**n, **self.norm_names(layer)}

    def expected_shapes(self, block: str, layer: int) -> dict[str, tuple[int, ...]]:
        s, n = self._spec, self.names(layer)
        D, rows = s.d_model, self.qkv_rows()
        shapes = {"qkv": (rows, D), "o": (D, s.n_heads * s.d_head), "bqkv": (rows,), "bo": (D,),
                  "norm_w": (D,), "norm_b": (D,)}
        return {n[r]: shape for r, shape in shapes.items() if r in n}

    def _build(self, layer: int, t: Mapping[str, Tensor]) -> AttentionLayer:
        W_Q, W_K, W_V = (to_heads(x) for x in self.layout(t["qkv"]))
        b_Q, b_K, b_V = self.layout(t["bqkv"]) if t.get("bqkv") is not None else (None, None, None)
        norm = norm_from(t, self.norm_kind)
        return self._layer(layer, W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=self.out_heads(t["o"]), b_Q=b_Q, b_K=b_K,
                           b_V=b_V, b_O=t.get("bo"), norm_q=norm, norm_kv=norm)

    def out_heads(self, w: Tensor) -> Tensor:
        """Output projection weight -> (H, d, D); nn.Linear (D, H*d) by default."""
        s = self._spec
        return heads_out(w, s.n_heads, s.d_head)  # (D, H*d) -> (H, d, D)
