"""What `qkinspect.composition` returns: the scores of every (earlier head, later head, kind), the pairs of blocks
that compose, and how the weights were processed; its records, JSON document and checked reader side by side.

Scores are held per (earlier layer, later layer, kind) as an H_a x H_b array, so the 1.5 million scores of a
32-layer, 32-head model's three kinds take 12 MB; records (one per earlier head, later head and kind) are made as
they are read.

Example:
    >>> result = qkinspect.composition("path/to/model")  # doctest: +SKIP
    >>> next(result.rows())  # doctest: +SKIP
    {'from_layer': 0, 'from_head': 0, 'to_layer': 1, 'to_head': 0, 'kind': 'q', 'score': 0.061, ...}
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from qkinspect.documents import SCHEMA, model_dict
from qkinspect.errors import InputError
from qkinspect.layer import ModelInfo
from qkinspect.notebook import Tabular
from qkinspect.processing import CompositionProcessing

KIND_TEXT = {"q": "queries", "k": "keys", "v": "values"}
DEFINITIONS = {
    "composition_q": "‖W_OV^a W_QK^b‖_F / (‖W_OV^a‖_F ‖W_QK^b‖_F), W_OV = W_V W_O, W_QK = W_Q W_Kᵀ (row vectors)",
    "composition_k": "‖W_OV^a W_QK^bᵀ‖_F / (‖W_OV^a‖_F ‖W_QK^b‖_F)",
    "composition_v": "‖W_OV^a W_OV^b‖_F / (‖W_OV^a‖_F ‖W_OV^b‖_F)",
    "baseline": "1/√D: the root-mean-square score of Gaussian factors of any shapes (E[score²] = 1/D exactly), "
                "D the width of the stream a writes and b reads",
    "ratio": "score / baseline",
    "by_kv_head": "with by kv-head, the later side is a key/value head g and its query heads G(g) stacked side by "
                  "side: ‖W_OV^a [X^b]_{b∈G(g)}‖_F / (‖W_OV^a‖_F ‖[X^b]_{b∈G(g)}‖_F), X^b = W_QK^b (q), W_QK^bᵀ (k), "
                  "W_OV^b (v); = √(Σ_b ‖X^b‖² score_b² / Σ_b ‖X^b‖²), the same null 1/√D",
}
BY = ("head", "kv-head")


@dataclass(frozen=True)
class BlockPair:
    """Which kinds of composition exist from the heads of one block into those of another, and why."""

    from_block: str
    to_block: str
    kinds: tuple[str, ...]
    width: int  # the residual stream's width D (baseline 1/√D)
    rule: str  # e.g. "layer i < layer j" or "every encoder layer: the decoder's keys and values read its output"


@dataclass(frozen=True)
class CompositionRecord:
    """One (earlier head, later head, kind)."""

    from_block: str
    from_layer: int
    from_head: int
    to_block: str
    to_layer: int
    to_head: int
    kind: str
    score: float
    baseline: float
    to_heads: tuple[int, ...] | None = None  # by kv-head: `to_head` is the key/value head, these its query heads

    @property
    def ratio(self) -> float:
        return self.score / self.baseline

    def row(self, blocks: bool = True) -> dict[str, Any]:
        later = ({"to_head": self.to_head} if self.to_heads is None else
                 {"to_kv_head": self.to_head, "to_heads": list(self.to_heads)})
        out = {"from_block": self.from_block, "from_layer": self.from_layer, "from_head": self.from_head,
               "to_block": self.to_block, "to_layer": self.to_layer, **later, "kind": self.kind,
               "score": self.score, "baseline": self.baseline, "ratio": self.ratio}
        if not blocks:
            del out["from_block"], out["to_block"]
        return out


Key = tuple[str, int, str, int, str]  # (from_block, from_layer, to_block, to_layer, kind)


@dataclass
class CompositionResult(Tabular):
    """Everything `qkinspect.composition` returns. In a notebook it shows `qkinspect composition`'s table (the 10
    strongest pairs of each kind); `to_pandas()` is a row per pair; `save(path)` writes what `-o path` writes.

    `scores[(from_block, from_layer, to_block, to_layer, kind)]`: an (H_a, H_b) float64 array over all heads of the
    two layers (NaN for a head with a zero norm); `heads()` and `rows()` apply the head selection. With
    `processing.by == "kv-head"` the later side is the key/value heads, (H_a, G_b) (`by_kv_head`).
    `read_norms[(block, layer, kind)]`: each later head's ‖W_QK^b‖_F (q, k) or ‖W_OV^b‖_F (v), which weigh the
    query heads of a key/value head when they are taken together.
    """

    PARQUET = True  # `save("x.parquet")` writes `columns()`, as `-o x.parquet` does

    model: ModelInfo
    processing: CompositionProcessing
    pairs: list[BlockPair]
    scores: dict[Key, np.ndarray] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    read_norms: dict[tuple[str, int, str], np.ndarray] = field(default_factory=dict)

    @property
    def by_kv(self) -> bool:
        return self.processing.by == "kv-head"

    def query_heads(self, block: str, kv_head: int) -> tuple[int, ...]:
        """The selected query heads of a later block's key/value head (h // (heads / kv heads) == kv_head)."""
        spec = self.model.block(block)
        rep = spec.n_heads // spec.n_kv_heads
        return tuple(h for h in _chosen(self.processing.to_heads, spec.n_heads).tolist() if h // rep == kv_head)

    def by_kv_head(self) -> CompositionResult:
        """The same scores with the later side grouped by key/value head: one score per (earlier head, key/value
        head, kind), that of its selected query heads stacked side by side (DEFINITIONS["by_kv_head"]): the root
        of the mean square of their scores weighted by ‖X^b‖², the query heads' own share of the stacked form. For
        K composition this is how strongly a writes into the key head's keys as the group's queries read them;
        under multi-head attention (a key head per query head) it is the head's own score.

        Raises:
            InputError: a result without the later heads' norms (a document saved before they were kept).
        """
        if self.by_kv:
            return self
        out = {}
        for key, s in self.scores.items():
            fb, fl, tb, tl, kind = key
            norms = self.read_norms.get((tb, tl, kind))
            if norms is None:
                raise InputError(f"{tb} layer {tl} ({kind}): the later heads' norms were not kept, so their key/value "
                                 "heads cannot be scored; compute the composition again")
            spec = self.model.block(tb)
            grouped = np.full((s.shape[0], spec.n_kv_heads), np.nan)
            for g in range(spec.n_kv_heads):
                heads = list(self.query_heads(tb, g))
                if heads:
                    w = norms[heads] ** 2  # (len G,)
                    grouped[:, g] = np.sqrt((s[:, heads] ** 2 * w).sum(axis=1) / w.sum())
            out[key] = grouped
        from dataclasses import replace

        return CompositionResult(self.model, replace(self.processing, by="kv-head"), self.pairs, out,
                                 list(self.warnings), dict(self.read_norms))

    @property
    def multi_block(self) -> bool:
        """Whether records name blocks (a model with more than one attention block)."""
        return len(self.model.blocks) > 1

    def baseline(self, from_block: str, to_block: str) -> float:
        for p in self.pairs:
            if p.from_block == from_block and p.to_block == to_block:
                return 1.0 / math.sqrt(p.width)
        raise KeyError((from_block, to_block))

    def heads(self, key: Key) -> tuple[np.ndarray, np.ndarray]:
        """The selected (earlier, later) head indexes of one score array (by kv-head: the later key/value heads
        with a selected query head)."""
        p = self.processing
        H_a, H_b = self.scores[key].shape
        if self.by_kv:
            later = np.array([g for g in range(H_b) if self.query_heads(key[2], g)], dtype=np.int64)
            return _chosen(p.from_heads, H_a), later
        return _chosen(p.from_heads, H_a), _chosen(p.to_heads, H_b)

    def _record(self, key: Key, a: int, b: int) -> CompositionRecord:
        fb, fl, tb, tl, kind = key
        return CompositionRecord(fb, fl, a, tb, tl, b, kind, float(self.scores[key][a, b]), self.baseline(fb, tb),
                                 self.query_heads(tb, b) if self.by_kv else None)

    def records(self, kinds: tuple[str, ...] | None = None) -> Iterator[CompositionRecord]:
        """One record per selected (earlier head, later head, kind), earlier layer first, then later layer, kind."""
        for key, s in self.scores.items():
            fb, fl, tb, tl, kind = key
            if kinds is not None and kind not in kinds:
                continue
            base = self.baseline(fb, tb)  # once per layer pair: a 7B model has 1.5 million records
            rows, cols = self.heads(key)
            later = [(b, self.query_heads(tb, b) if self.by_kv else None) for b in cols.tolist()]
            for a in rows.tolist():
                for b, group in later:
                    yield CompositionRecord(fb, fl, a, tb, tl, b, kind, float(s[a, b]), base, group)

    def rows(self) -> Iterator[dict[str, Any]]:
        """The records as tidy dicts (`from_block`/`to_block` only for a model with several blocks)."""
        blocks = self.multi_block
        return (r.row(blocks) for r in self.records())

    def columns(self) -> dict[str, np.ndarray]:
        """The rows as columns (numpy arrays), for Parquet and pandas without a dict per row."""
        parts: dict[str, list[np.ndarray]] = {}
        for key, s in self.scores.items():
            fb, fl, tb, tl, kind = key
            rows, cols = self.heads(key)
            a, b = np.meshgrid(rows, cols, indexing="ij")  # (n_a, n_b) each
            n = a.size
            score = s[np.ix_(rows, cols)].ravel()
            base = self.baseline(fb, tb)
            later = (("to_head", b.ravel()),) if not self.by_kv else (
                ("to_kv_head", b.ravel()),
                ("to_heads", np.array([",".join(map(str, self.query_heads(tb, g))) for g in b.ravel()], dtype=object)))
            for name, v in (("from_block", np.full(n, fb, dtype=object)), ("from_layer", np.full(n, fl)),
                            ("from_head", a.ravel()), ("to_block", np.full(n, tb, dtype=object)),
                            ("to_layer", np.full(n, tl)), *later,
                            ("kind", np.full(n, kind, dtype=object)), ("score", score),
                            ("baseline", np.full(n, base)), ("ratio", score / base)):
                parts.setdefault(name, []).append(v)
        later_names = ("to_kv_head", "to_heads") if self.by_kv else ("to_head",)
        names = [n for n in ("from_block", "from_layer", "from_head", "to_block", "to_layer", *later_names, "kind",
                             "score", "baseline", "ratio") if self.multi_block or n not in ("from_block", "to_block")]
        return {n: np.concatenate(parts[n]) if parts.get(n) else np.array([]) for n in names}

    def to_pandas(self):
        """The records as a pandas DataFrame (needs pandas).

        Example:
            >>> df = qkinspect.composition("path/to/model").to_pandas()  # doctest: +SKIP
            >>> df[df.kind == "k"].nlargest(5, "score")  # doctest: +SKIP
        """
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("to_pandas() needs pandas: pip install pandas") from None
        return pd.DataFrame(self.columns())

    def top(self, kind: str, n: int) -> list[CompositionRecord]:
        """The `n` strongest selected pairs of one kind (largest ratio first; NaN never)."""
        best: list[tuple[float, Key, int, int]] = []
        for key, s in self.scores.items():
            if key[4] != kind:
                continue
            rows, cols = self.heads(key)
            sub = s[np.ix_(rows, cols)] / self.baseline(key[0], key[2])
            flat = np.where(np.isfinite(sub), sub, -np.inf).ravel()
            k = min(n, flat.size)
            for i in np.argpartition(-flat, k - 1)[:k] if k else []:
                if np.isfinite(flat[i]):
                    best.append((float(flat[i]), key, int(rows[i // len(cols)]), int(cols[i % len(cols)])))
        best.sort(key=lambda t: -t[0])
        return [self._record(key, a, b) for _, key, a, b in best[:n]]

    def table_rows(self) -> list[dict[str, Any]]:
        """The CSV's rows: one per (earlier head, later head, kind)."""
        return list(self.rows())

    def parquet_data(self) -> dict[str, np.ndarray]:
        return self.columns()

    def render_table(self, console) -> None:
        """`qkinspect composition`'s table of this result."""
        from qkinspect.terminal.composition import render_composition

        render_composition(console, self)

    def document(self) -> dict[str, Any]:
        """The JSON document `qkinspect composition -o FILE.json` and `save("x.json")` write: schema, tool, model,
        processing, definitions, block pairs, records, read norms, warnings."""
        from qkinspect.version import __version__

        return {"schema": SCHEMA, "kind": "composition", "tool": {"name": "qkinspect", "version": __version__},
                "model": model_dict(self.model), "processing": asdict(self.processing), "definitions": DEFINITIONS,
                "pairs": [asdict(p) for p in self.pairs], "records": list(self.rows()),
                "read_norms": [{"block": b, "layer": layer, "kind": k, "norms": v.tolist()}
                               for (b, layer, k), v in self.read_norms.items()],
                "warnings": list(self.warnings)}

    to_dict = document  # deprecated: its name before every result's document was `document()` (docs/notebook.md)


def _chosen(sel: tuple[int, ...] | None, n: int) -> np.ndarray:
    return np.arange(n) if sel is None else np.array([h for h in sel if h < n], dtype=np.int64)
