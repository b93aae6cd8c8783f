"""The records of `qkinspect.directions` and the document they make (docs/directions.md).

One `DirectionRecord` per (block, layer, head, matrix, side, direction or subspace, sign): the tokens that read a
singular direction most strongly. A direction standing alone gives two records per side, sign "+" and "-" (the
tokens of +v and of −v); a run of near-equal singular values (σ_i / σ_{i+1} < 1.05) gives one record per side with
sign "±", `indices` naming the whole run, its tokens ranked by the norm of their projection onto the subspace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from qkinspect.layer import ModelInfo
from qkinspect.notebook import Tabular

MATRICES = {"ov": ("read", "write"), "qk": ("query", "key")}
SIDE_TEXT = {"read": "what it reads (embedding)", "write": "what it writes (unembedding)",
             "query": "queries (embedding)", "key": "keys (embedding)"}


@dataclass(frozen=True)
class DirectionRecord:
    """Tokens reading one singular direction (or degenerate subspace) of one head's W_OV or W_QK.

    `index`, `sigma`: the direction's rank (0 = largest) and singular value; for a subspace, its first.
    `indices`, `sigmas`: every direction the record covers (one, or a run of near-equal singular values).
    `sign`: "+" or "-" (which of ±v the tokens read), "±" for a subspace (read by projection norm).
    `scores`: each token's dot product with the signed direction (for "-": with −v), or its projection norm;
    with the cosine reading, divided by the token vector's norm.
    `cut`: a subspace whose near-equal run goes on past it (cut at K directions past the K asked for)."""

    block: str
    layer: int
    head: int
    kv_head: int
    matrix: str  # "ov" or "qk"
    side: str  # "read" / "write" (ov), "query" / "key" (qk)
    index: int
    sigma: float
    sign: str
    indices: tuple[int, ...]
    sigmas: tuple[float, ...]
    token_ids: tuple[int, ...]
    tokens: tuple[str | None, ...]
    scores: tuple[float, ...]
    cut: bool = False

    @property
    def subspace(self) -> bool:
        return len(self.indices) > 1

    def row(self) -> dict[str, Any]:
        return {"block": self.block, "layer": self.layer, "head": self.head, "kv_head": self.kv_head,
                "matrix": self.matrix, "side": self.side, "index": self.index, "sigma": self.sigma,
                "sign": self.sign, "indices": list(self.indices), "sigmas": list(self.sigmas),
                "token_ids": list(self.token_ids), "tokens": list(self.tokens), "scores": list(self.scores),
                "cut": self.cut}


@dataclass(frozen=True)
class Readout:
    """What the tokens were read through: `embedding` and `unembedding` name the stored tensors (the same one when
    tied), `final_norm` the gain folded into the write side (None: none), `tokenizer` where token text came from
    (None: ids only)."""

    embedding: str
    unembedding: str
    tied: bool
    final_norm: str | None
    vocab_size: int
    tokenizer: str | None
    tokenizer_size: int | None


@dataclass(frozen=True)
class DirectionsResult(Tabular):
    """`qkinspect.directions`'s answer: records in (block, layer, head, matrix, side, index, sign) order. In a
    notebook it shows `qkinspect directions`' table; `to_pandas()` is a row per record; `save(path)` writes what
    `-o path` writes."""

    PARQUET = True

    model: ModelInfo
    records: list[DirectionRecord]
    readout: Readout
    processing: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # heads left out: non-finite weights

    def rows(self) -> list[dict[str, Any]]:
        return [r.row() for r in self.records]

    def table_rows(self) -> list[dict[str, Any]]:
        """The CSV's rows: one per record (`rows`)."""
        return self.rows()

    def render_table(self, console) -> None:
        """`qkinspect directions`' table of this result."""
        from qkinspect.terminal.directions import render_directions

        render_directions(console, self)

    def document(self) -> dict[str, Any]:
        """The JSON document (schema qkinspect/1, kind "directions")."""
        from dataclasses import asdict

        from qkinspect.documents import envelope, model_dict

        return envelope("directions", model=model_dict(self.model), processing=self.processing,
                        readout=asdict(self.readout), definitions=DEFINITIONS, notes=list(self.notes),
                        warnings=list(self.warnings), directions=self.rows())


DEFINITIONS = {
    "ov": "W_OV = W_V W_O (row vectors: the head adds (attention-weighted) x W_OV to the residual stream)",
    "qk": "W_QK = W_Q W_Kᵀ (the score of query x and key y is x W_QK yᵀ; zero-offset form for rotary heads)",
    "read": "left singular vector u of W_OV, scored against the token embedding: e_t · u",
    "write": "right singular vector v of W_OV, scored against the unembedding with the final norm's gain folded: "
             "(γ ∘ w_t) · v",
    "query": "left singular vector of W_QK, scored against the token embedding",
    "key": "right singular vector of W_QK, scored against the token embedding",
    "sign": "the pair (u, v) is defined up to a common sign; + is the orientation whose largest-magnitude entry of v "
            "is positive; reading +u writes +σv (ov), a query along +u favours keys along +v (qk)",
    "subspace": "where σ_i / σ_{i+1} < 1.05 the directions are read together: tokens ranked by the norm of their "
                "vector's projection onto the span (sign '±'); a run reaching past the K directions asked for grows "
                "at most K further (cut: true where it goes on)",
    "reading": "dot: a token's score is its vector's dot product with the direction (or its projection's norm); "
               "cosine: that divided by the token vector's norm, so long rows do not rank high everywhere",
}

__all__ = ["DirectionRecord", "DirectionsResult", "Readout", "MATRICES", "SIDE_TEXT", "DEFINITIONS"]
