"""Frozen result records (ARCHITECTURE.md §5): one row per (block, layer, head) and per (block, layer).

`metrics/` produces them, `report/` and `cli/` only read them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qkinspect.documents import envelope, json_safe, model_dict
from qkinspect.layer import ModelInfo
from qkinspect.processing import Processing

if TYPE_CHECKING:
    import numpy as np

ANALYSIS_KIND = "analyze"  # the document's "kind": what `qkinspect analyze -o FILE.json` and save() write


@dataclass(frozen=True)
class HeadRecord:
    """Metrics of one head. `values` maps metric name -> float (NaN where undefined); `rank_q`, `rank_k`,
    `rank_v`: the numerical rank kept (σ > 1e-5 σ_max) of W_Q, of its KV head's W_K and W_V (None: not measured)."""

    block: str
    layer: int
    head: int
    kv_head: int
    values: Mapping[str, float]
    rank_q: int | None = None
    rank_k: int | None = None
    rank_v: int | None = None

    def row(self) -> dict[str, Any]:
        ranks = {k: v for k, v in (("rank_q", self.rank_q), ("rank_k", self.rank_k), ("rank_v", self.rank_v))
                 if v is not None}
        return {"block": self.block, "layer": self.layer, "head": self.head, "kv_head": self.kv_head, **ranks,
                **self.values}


@dataclass(frozen=True)
class LayerRecord:
    """Metrics of one layer: summaries over its measured heads (`n_heads`: all of them, or the selection),
    the summed form's metrics when asked (always over all heads), and the query-side head-by-head subspace overlap
    matrix (n_heads x n_heads, in head order) when asked."""

    block: str
    layer: int
    n_heads: int
    values: Mapping[str, float]
    head_overlap: np.ndarray | None = None

    def row(self) -> dict[str, Any]:
        return {"block": self.block, "layer": self.layer, "n_heads": self.n_heads, **self.values}


@dataclass(frozen=True)
class Baseline:
    """A statistic for Gaussian factors of the same shapes (fixed seed): tells structure from chance."""

    block: str
    metric: str
    mean: float
    std: float
    n: int


@dataclass
class AnalysisResult:
    """Everything `qkinspect.analyze` returns."""

    model: ModelInfo
    processing: Processing
    heads: list[HeadRecord]
    layers: list[LayerRecord]
    baselines: list[Baseline] = field(default_factory=list)
    # (block, layer, head) -> {"qk": singular values, "qk_eig": eigenvalues (complex), "ov": ..., "q": ...}
    spectra: dict[tuple[str, int, int], dict[str, np.ndarray]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    metric_names: list[str] = field(default_factory=list)

    def baseline(self, block: str, metric: str) -> Baseline | None:
        for b in self.baselines:
            if b.block == block and b.metric == metric:
                return b
        return None

    def head_rows(self) -> list[dict[str, Any]]:
        return [h.row() for h in self.heads]

    def layer_rows(self) -> list[dict[str, Any]]:
        return [r.row() for r in self.layers]

    def table_rows(self, by: str = "head") -> list[dict[str, Any]]:
        """The rows of `qkinspect analyze --format csv` (`--by layer`: by="layer"): the model's name, then the
        head's (or layer's) record."""
        rows = self.head_rows() if by == "head" else self.layer_rows()
        return [{"model": self.model.name, **r} for r in rows]

    def notes(self) -> list[str]:
        """What the run tells beside its warnings, asking nothing of the user (the CLI writes them on stderr as
        notes): the heads recomputed in float64, the blocks whose q/k norms were measured unfolded."""
        from qkinspect.metrics.heads import recompute_note
        from qkinspect.terminal.tables import qk_norm_line

        p = self.processing
        out = [recompute_note(p.recomputed_float64, len(self.heads), p.precision)] if p.recomputed_float64 else []
        return out + ([qk_norm_line(p.qk_norm_not_folded)] if p.qk_norm_not_folded else [])

    def document(self) -> dict[str, Any]:
        """The saved analysis as a JSON-ready dict: the document `qkinspect analyze -o FILE.json` and
        `save("x.json")` write (schema qkinspect/1, "kind": "analyze"; docs/output.md), which `plot` and `report`
        read. NaN becomes null."""
        from qkinspect.metrics.registry import definitions

        return json_safe(envelope(
            ANALYSIS_KIND,
            model=model_dict(self.model),
            processing=asdict(self.processing),
            definitions=definitions(self.metric_names),
            baselines=[asdict(b) for b in self.baselines],
            heads=self.head_rows(),
            layers=[
                {**r.row(), **({"head_overlap": r.head_overlap.tolist()} if r.head_overlap is not None else {})}
                for r in self.layers
            ],
            warnings=list(self.warnings),
        ))

    to_dict = document  # deprecated: its name before every result's document was `document()` (docs/notebook.md)

    def save(self, path: str | Path) -> Path:
        """Write the analysis to `path` (atomically) as `qkinspect analyze -o path` writes it, byte for byte, in
        the format the extension names: `.json` the whole analysis (`qkinspect plot FILE.json` and `qkinspect
        report FILE.json` then draw it without the model; the spectra are not kept), `.csv` and `.ndjson`/`.jsonl`
        a row per head, `.txt` the tables. Returns the path.

        Raises:
            InputError: an extension that names no format (naming the path).
            OutputError: the file cannot be written.

        Example:
            >>> qkinspect.analyze().save("run.json")  # doctest: +SKIP
            >>> # then: qkinspect plot run.json --kind symmetry -o symmetry.png
        """
        from qkinspect.formats import save_result
        from qkinspect.terminal.analysis import default_columns, render_analysis

        return save_result(path, document=self.document,
                           rows=self.table_rows,
                           render=lambda console: render_analysis(console, self, columns=default_columns(self)))

    def to_pandas(self, by: str = "head"):
        """Head records (or, with by="layer", layer records) as a pandas DataFrame (needs pandas), with the
        columns of `qkinspect analyze --format csv`: model, block, layer, head, kv_head, then the metrics.

        Example:
            >>> df = qkinspect.analyze().to_pandas()  # doctest: +SKIP
            >>> df.groupby("layer")["symmetry"].median()  # doctest: +SKIP
        """
        from qkinspect.notebook import data_frame

        if by not in ("head", "layer"):
            from qkinspect.errors import InputError

            raise InputError(f"by={by!r}: choose 'head' or 'layer'")
        return data_frame(self.table_rows(by))

    def _repr_html_(self) -> str:
        """A notebook cell's view: the tables `qkinspect analyze` prints (qkinspect.notebook)."""
        from qkinspect.notebook import html_table
        from qkinspect.terminal.analysis import default_columns, render_analysis

        return html_table(lambda console: render_analysis(console, self, columns=default_columns(self)))
