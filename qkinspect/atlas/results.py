"""What an atlas holds: tidy records (`AtlasRecord`), the models' facts, failures (`AtlasResult`);
`qkinspect.atlas.saved` reads it from its folder.

The records are typed, as the other capabilities' are; the facts stay dicts (FACT_FIELDS: the per-model descriptive
table, one row per model and block, written and shown as it is), as do the baselines."""

from __future__ import annotations

import html
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from qkinspect.notebook import Tabular
from qkinspect.sweep.keys import Failure

# The metrics of the one-row-per-model table and of the notebook view, when the atlas has them.
SUMMARY_METRICS = ("symmetry", "symmetry_layer", "directionality", "overlap_qk", "overlap_qv", "overlap_kv",
                   "qk_effective_rank")


@dataclass(frozen=True)
class AtlasRecord:
    """One tidy record of an atlas (`qkinspect.atlas.stats`): a metric's median and quartiles over a block's heads,
    in the whole block (`scope = "model"`: `layer` and `depth` None) or in one layer (`scope = "layer"`, at the
    layer's normalised depth); `n` the heads with a finite value; `chance` the metric's random baseline in the block
    (None where the analysis has none), `vs_chance` the median over it (the overlaps only; None for the others);
    `path` the model as given. `row()` is the record as the JSON, CSV and `to_pandas()` write it
    (RECORD_FIELDS, in that order), as every capability's records name it."""

    model: str
    block: str
    metric: str
    scope: str  # "model" or "layer"
    layer: int | None
    depth: float | None
    median: float
    q1: float
    q3: float
    n: int
    chance: float | None
    vs_chance: float | None
    path: str

    def row(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in RECORD_FIELDS}

    to_dict = row  # deprecated: its name before the records' rows were `row()` everywhere (docs/notebook.md)


# The records' fields, in the order the JSON, the CSV and `to_pandas()` write them.
RECORD_FIELDS = tuple(f.name for f in fields(AtlasRecord))


@dataclass(frozen=True)
class AtlasRelation:
    """How one weight metric relates to one behaviour score in one model and block (an atlas with behaviour, or a
    heads document among its models): Spearman's ρ over the block's heads (`scope` "all") or of ranks within
    layers ("within"), its 95 % bootstrap interval (`low`, `high`), permutation p-value and heads `n`, as
    `qkinspect.heads` computes them (docs/heads.md, "Relations"). `row()`: RELATION_FIELDS, in order."""

    model: str
    block: str
    metric: str
    score: str
    scope: str
    rho: float | None
    low: float | None
    high: float | None
    p: float | None
    n: int
    path: str

    def row(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in RELATION_FIELDS}

    to_dict = row  # deprecated: its name before the records' rows were `row()` everywhere (docs/notebook.md)


RELATION_FIELDS = tuple(f.name for f in fields(AtlasRelation))
# The facts' fields (dicts, built by `qkinspect.atlas.stats.facts`), the columns of `to_pandas("facts")`.
FACT_FIELDS = ("model", "block", "kind", "family", "format", "layers", "heads", "kv_heads", "d_model", "d_head",
               "positional", "qk_norm", "qk_norm_raw", "attention_params", "entry", "path")


@dataclass
class AtlasResult(Tabular):
    """An atlas: `records` (`AtlasRecord`s: model, block, metric, scope, layer, depth, median, q1, q3, n,
    chance, vs_chance, path), `facts` (one dict per model and block: family, layers, heads, kv heads, d_model,
    d_head, positional, q/k norm and whether it was measured raw, attention parameters, path), the models in the
    order given (named as `qkinspect info` names them; `paths` maps each to the model as given), the failures,
    notes (e.g. a saved analysis without the layer form, blocks with q/k norms measured raw), and `baselines`:
    each block's random baseline as its analysis measured it (the same statistic for Gaussian weights of the
    block's shapes: mean, std, n), which tells structure from chance (an overlap of 0.4 is chance where
    d_head / d_model = 0.4).

    With behaviour scores (`behaviour=True`, or heads documents among the models), `relations` holds each
    model's `AtlasRelation`s (`to_pandas("relations")`).

    Example:
        >>> atlas = qkinspect.atlas(["./bert", "./gpt2"], out="atlas/")  # doctest: +SKIP
        >>> df = atlas.to_pandas()  # doctest: +SKIP
        >>> df[(df.metric == "symmetry") & (df.scope == "layer")].pivot(index="depth", columns="model",
        ...                                                              values="median")  # doctest: +SKIP
    """

    PARQUET = True

    folder: Path
    options: dict[str, Any]
    models: list[str]
    records: list[AtlasRecord] = field(default_factory=list)
    facts: list[dict[str, Any]] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    baselines: list[dict[str, Any]] = field(default_factory=list)  # model, block, metric, mean, std, n
    paths: dict[str, str] = field(default_factory=dict)  # model name -> the model as given (path, id, file)
    relations: list[AtlasRelation] = field(default_factory=list)  # with behaviour: ρ of weight metric and score

    @property
    def metrics(self) -> list[str]:
        """The metrics the records hold, in their first order."""
        return list(dict.fromkeys(r.metric for r in self.records))

    def summary(self, metric: str, model: str, block: str) -> AtlasRecord | None:
        """The model-scope record of `metric` for one model and block (None when the atlas has none)."""
        for r in self.records:
            if r.scope == "model" and r.metric == metric and r.model == model and r.block == block:
                return r
        return None

    def rows(self) -> list[dict[str, Any]]:
        """One row per model and block: its facts, then the median of each summary metric (over heads; the layer
        form's over layers) and, where the metric has a random baseline, its chance level (`<metric>_chance`)."""
        out = []
        for f in self.facts:
            row = dict(f)
            for m in SUMMARY_METRICS:
                s = self.summary(m, f["model"], f["block"])
                if s is not None:
                    row[m] = s.median
                    if s.chance is not None:
                        row[f"{m}_chance"] = s.chance
            out.append(row)
        return out

    def to_pandas(self, what: str = "records"):
        """The records (`what="records"`, columns RECORD_FIELDS), the facts (`"facts"`) or the one-row-per-model
        table (`"models"`) as a pandas DataFrame (needs pandas)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("to_pandas() needs pandas: pip install pandas") from None
        if what == "records":
            df = pd.DataFrame(self.table_rows(), columns=list(RECORD_FIELDS))
            return df.astype({"layer": "Int64"})  # null for scope "model", not a float NaN
        if what == "facts":
            return pd.DataFrame(self.facts, columns=list(FACT_FIELDS))
        if what == "relations":
            return pd.DataFrame(self.relation_rows(), columns=list(RELATION_FIELDS))
        if what == "models":
            return pd.DataFrame(self.rows())
        from qkinspect.errors import InputError

        raise InputError(f"what={what!r}: choose 'records', 'facts', 'models' or 'relations'")

    def table_rows(self) -> list[dict[str, Any]]:
        """The CSV's rows: the tidy records, as dicts (RECORD_FIELDS)."""
        return [r.row() for r in self.records]

    def relation_rows(self) -> list[dict[str, Any]]:
        """The relations across models, as dicts (RELATION_FIELDS): `atlas --relations -o FILE.csv`."""
        return [r.row() for r in self.relations]

    def document(self) -> dict[str, Any]:
        """The JSON document `qkinspect atlas -o FILE.json` and `save("x.json")` write: the envelope (schema, kind
        "atlas", tool), then the folder, options, models, facts, records, baselines, notes and failures."""
        from qkinspect.documents import envelope

        return envelope("atlas", **self._body())

    def to_dict(self) -> dict[str, Any]:
        """Deprecated (its name before every result's document was `document()`, docs/notebook.md): `document()`
        without the envelope's schema, kind and tool."""
        return self._body()

    def _body(self) -> dict[str, Any]:
        out = {"folder": str(self.folder), "options": self.options, "models": list(self.models),
               "paths": [self.paths.get(m, m) for m in self.models],
               "facts": self.facts, "records": self.table_rows(), "baselines": self.baselines,
               "notes": list(self.notes),
               "failures": [{"model": f.name, "error": f.error} for f in self.failures]}
        if self.relations:  # an atlas with behaviour scores (its documents without them stay as they were)
            out["relations"] = self.relation_rows()
        return out

    def render_table(self, console) -> None:
        """`qkinspect atlas`'s table of this result (what `save("x.txt")` writes)."""
        from qkinspect.terminal.atlas import render_atlas

        render_atlas(console, self)

    def _repr_html_(self) -> str:
        """A notebook's view: the one-row-per-model table (medians), then the failures and notes."""
        rows = self.rows()
        metrics = [m for m in SUMMARY_METRICS if any(m in r for r in rows)]
        head = ["model", "block", "family", "layers", "heads", "kv_heads", "d_model", "attention_params", *metrics]
        cells = "".join("<tr>" + "".join(f"<td>{_cell(r.get(k))}</td>" for k in head) + "</tr>" for r in rows)
        extra = "".join(f"<p>failed: {html.escape(f.name)}: {html.escape(f.error)}</p>" for f in self.failures)
        extra += "".join(f"<p>note: {html.escape(n)}</p>" for n in self.notes)
        return (f"<p><b>qkinspect atlas</b> {html.escape(str(self.folder))}: {len(self.models)} models, "
                f"{len(self.records)} records (medians over heads; the layer form's over layers)</p>"
                f"<table><thead><tr>{''.join(f'<th>{html.escape(h)}</th>' for h in head)}</tr></thead>"
                f"<tbody>{cells}</tbody></table>{extra}")

    def __repr__(self) -> str:
        return (f"AtlasResult({str(self.folder)!r}: {len(self.models)} models, {len(self.facts)} blocks, "
                f"{len(self.records)} records, {len(self.failures)} failed)")


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    return html.escape("" if v is None else str(v))
