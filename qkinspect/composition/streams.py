"""Which heads compose into which (docs/composition.md, "Which heads compose"): each attention layer as a reader and
writer of residual streams, and the pairs of blocks that compose, with their rule in words.

A head writes into one residual stream and reads its queries from one and its keys and values from one.
Self-attention reads and writes its own block's stream; a decoder's cross-attention reads queries from (and writes
into) the decoder's stream just after that layer's self-attention, and keys and values from the encoder's output,
i.e. after every encoder layer. An earlier head a composes into a later head b for kind q when a writes the stream
b's queries read before b reads it (k and v likewise with b's key/value stream).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from qkinspect.composition.results import BlockPair
from qkinspect.layer import BlockSpec, ModelInfo
from qkinspect.metrics.composition import KINDS


@dataclass(frozen=True)
class Unit:
    """One attention layer as a reader and writer of residual streams (None: none in this model)."""

    block: str
    layer: int
    heads: int
    width: int  # the width it writes (d_model)
    writes: str | None
    q_reads: str | None
    kv_reads: str | None
    pos: float  # where on its stream(s) it reads and writes; cross-attention keys read the encoder at +inf
    kv_pos: float

    def kinds_into(self, b: Unit) -> tuple[str, ...]:
        """The kinds of composition of this (earlier) unit into `b`."""
        if self.writes is None:
            return ()
        q = b.q_reads == self.writes and self.pos < b.pos
        kv = b.kv_reads == self.writes and self.pos < b.kv_pos
        return (("q",) if q else ()) + (("k", "v") if kv else ())


def units(info: ModelInfo) -> list[Unit]:
    """Every layer of the model as a `Unit`, in file order."""
    keys = {b.key for b in info.blocks}
    named = {b.name: b.key for b in info.blocks if b.name != "cross"}
    out = []
    for b in info.blocks:
        for i in range(b.n_layers):
            out.append(_unit(b, i, keys, named))
    return out


def _unit(b: BlockSpec, i: int, keys: set[str], named: dict[str, str]) -> Unit:
    if b.name != "cross":  # self-attention: its own stream; 2i leaves room for a cross-attention after it
        return Unit(b.key, i, b.n_heads, b.d_model, b.key, b.key, b.key, 2 * i, 2 * i)
    if b.label == "pooling":  # SigLIP's pooling head: a learned query, keys/values from the vision tower's output
        return Unit(b.key, i, b.n_heads, b.d_model, None, None, "vision" if "vision" in keys else None, 2 * i,
                    math.inf)
    return Unit(b.key, i, b.n_heads, b.d_model, named.get("decoder"), named.get("decoder"), named.get("encoder"),
                2 * i + 1, math.inf)


def block_pairs(us: list[Unit], info: ModelInfo) -> list[BlockPair]:
    """For each (earlier block, later block) with any composition, its kinds, stream width and rule in words."""
    found: dict[tuple[str, str], set[str]] = {}
    for a in us:
        for b in us:
            k = a.kinds_into(b)
            if k:
                found.setdefault((a.block, b.block), set()).update(k)
    out = []
    for (fa, fb), kinds in found.items():
        ka, kb = info.block(fa), info.block(fb)
        ordered = tuple(k for k in KINDS if k in kinds)
        out.append(BlockPair(fa, fb, ordered, ka.d_model, _rule(ka, kb)))
    return out


def _rule(a: BlockSpec, b: BlockSpec) -> str:
    if b.name == "cross" and a.name != "cross" and b.label == "pooling":
        return f"every {a.key} layer into the pooling head's keys and values (they read the tower's output)"
    if b.name == "cross" and a.name == "encoder":
        return "every encoder layer into every cross-attention layer's keys and values (they read the encoder output)"
    if b.name == "cross" and a.name == "decoder":
        return "decoder self-attention layer i into cross-attention layer j >= i, queries only (same stream)"
    if a.name == "cross" and b.name == "decoder":
        return "cross-attention layer i into decoder self-attention layer j > i (the decoder stream)"
    if a.name == "cross" and b.name == "cross":
        return "cross-attention layer i into cross-attention layer j > i, queries only"
    return "layer i into layer j > i"
