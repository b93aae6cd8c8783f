"""What an atlas holds, read from its folder: tidy records, the models' facts, failures (`AtlasResult`)."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qkinspect.notebook import Tabular
from qkinspect.sweep.keys import Failure

# The metrics of the one-row-per-model table and of the notebook view, when the atlas has them.
SUMMARY_METRICS = ("symmetry", "symmetry_layer", "directionality", "overlap_qk", "overlap_qv", "overlap_kv",
                   "qk_effective_rank")


@dataclass
class AtlasResult(Tabular):
    """An atlas: `records` (RECORD_FIELDS dicts: model, block, metric, scope, layer, depth, median, q1, q3, n,
    chance, vs_chance, path), `facts` (one dict per model and block: family, layers, heads, kv heads, d_model,
    d_head, positional, q/k norm and whether it was measured raw, attention parameters, path), the models in the
    order given (named as `qkinspect info` names them; `paths` maps each to the model as given), the failures,
    notes (e.g. a saved analysis without the layer form, blocks with q/k norms measured raw), and `baselines`:
    each block's random baseline as its analysis measured it (the same statistic for Gaussian weights of the
    block's shapes: mean, std, n), which tells structure from chance (an overlap of 0.4 is chance where
    d_head / d_model = 0.4).

    Example:
        >>> atlas = qkinspect.atlas(["./bert", "./gpt2"], out="atlas/")  # doctest: +SKIP
        >>> df = atlas.to_pandas()  # doctest: +SKIP
        >>> df[(df.metric == "symmetry") & (df.scope == "layer")].pivot(index="depth", columns="model",
        ...                                                              values="median")  # doctest: +SKIP
    """

    folder: Path
    options: dict[str, Any]
    models: list[str]
    records: list[dict[str, Any]] = field(default_factory=list)
    facts: list[dict[str, Any]] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    baselines: list[dict[str, Any]] = field(default_factory=list)  # model, block, metric, mean, std, n
    paths: dict[str, str] = field(default_factory=dict)  # model name -> the model as given (path, id, file)

    @property
    def metrics(self) -> list[str]:
        """The metrics the records hold, in their first order."""
        return list(dict.fromkeys(r["metric"] for r in self.records))

    def summary(self, metric: str, model: str, block: str) -> dict[str, Any] | None:
        """The model-scope record of `metric` for one model and block (None when the atlas has none)."""
        for r in self.records:
            if r["scope"] == "model" and r["metric"] == metric and r["model"] == model and r["block"] == block:
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
                    row[m] = s["median"]
                    if s.get("chance") is not None:
                        row[f"{m}_chance"] = s["chance"]
            out.append(row)
        return out

    def to_pandas(self, what: str = "records"):
        """The records (`what="records"`, columns RECORD_FIELDS), the facts (`"facts"`) or the one-row-per-model
        table (`"models"`) as a pandas DataFrame (needs pandas)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("to_pandas() needs pandas: pip install pandas") from None
        from qkinspect.zoo.stats import FACT_FIELDS, RECORD_FIELDS

        if what == "records":
            df = pd.DataFrame(self.records, columns=list(RECORD_FIELDS))
            return df.astype({"layer": "Int64"})  # null for scope "model", not a float NaN
        if what == "facts":
            return pd.DataFrame(self.facts, columns=list(FACT_FIELDS))
        if what == "models":
            return pd.DataFrame(self.rows())
        from qkinspect.errors import InputError

        raise InputError(f"what={what!r}: choose 'records', 'facts' or 'models'")

    def table_rows(self) -> list[dict[str, Any]]:
        """The CSV's rows: the tidy records."""
        return list(self.records)

    def document(self) -> dict[str, Any]:
        """The JSON document `qkinspect atlas -o FILE.json` writes; `save(path)` writes it."""
        from qkinspect.documents import envelope

        return envelope("atlas", **self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {"folder": str(self.folder), "options": self.options, "models": list(self.models),
                "paths": [self.paths.get(m, m) for m in self.models],
                "facts": self.facts, "records": self.records, "baselines": self.baselines, "notes": list(self.notes),
                "failures": [{"model": f.name, "error": f.error} for f in self.failures]}

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


def read_atlas(folder: str | Path) -> AtlasResult:
    """The atlas in `folder` (qkinspect atlas --out), every file checked where it enters (qkinspect.zoo.folder).

    Raises:
        InputError: not an atlas folder, or one of its files is not what it is filed as.
    """
    from qkinspect.analysis.saved import read_saved
    from qkinspect.sweep import read_sweep
    from qkinspect.zoo import folder as store
    from qkinspect.zoo.stats import entry_stats

    folder = Path(folder)
    options, entries, failures = store.read_manifest(folder)
    results: dict[str, dict[str, Any]] = {}
    if any(e["entry"] == "model" for e in entries):
        sweep = read_sweep(folder / store.MODELS)
        results = {ck.name: sweep.results[ck.identity]["result"] for ck in sweep.checkpoints
                   if ck.identity in sweep.results}
    docs: list[tuple[dict[str, str], dict[str, Any] | None]] = []
    for e in entries:
        if e["entry"] == "saved":
            docs.append((e, read_saved(folder / e["file"]).to_dict()))
        else:  # None: failed (listed in failures), or not computed yet (an interrupted atlas)
            docs.append((e, results.get(e["name"])))
    names = display_names([(e["name"], doc) for e, doc in docs])
    atlas = AtlasResult(folder, options, names, failures=list(failures),
                        paths={n: e["name"] for n, (e, _) in zip(names, docs, strict=True)})
    for name, (e, doc) in zip(names, docs, strict=True):
        if doc is None:
            continue
        if e["entry"] == "saved" and not doc["processing"].get("layer_form"):
            atlas.notes.append(f"{e['name']}: saved without the layer form, so it has no layer-form records")
        records, facts = entry_stats(name, doc, e["entry"], path=e["name"])
        atlas.records += records
        atlas.facts += facts
        atlas.baselines += [{"model": name, **{k: b.get(k) for k in ("block", "metric", "mean", "std", "n")}}
                            for b in doc.get("baselines") or []]
    raw = [f"{f['model']} [{f['block']}]" for f in atlas.facts if f.get("qk_norm_raw")]
    if raw:
        atlas.notes.append(f"q/k norms not folded ({', '.join(raw)}): measured raw, the W_Q W_Kᵀ of the stored "
                           f"projections, not what attention computes; {QK_NORM_HINT}")
    return atlas


# How an atlas is measured with the q/k-norm gains folded in, as the command and the library spell it.
QK_NORM_HINT = "an atlas with --fold-qk-norm (fold_qk_norm=True) measures W_Q diag(γ_q γ_k) W_Kᵀ"


def display_names(entries: list[tuple[str, dict[str, Any] | None]]) -> list[str]:
    """Each entry's name as `qkinspect info` names the model (the analysis's model name: from the config or the GGUF
    metadata, else the folder's or file's base name); the path as given where there is no analysis. A name two
    entries share is numbered from its second entry on ("name (2)"), so every model keeps its own line and colour."""
    names = [(doc or {}).get("model", {}).get("name") or given for given, doc in entries]
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n} ({seen[n]})")
    return out
