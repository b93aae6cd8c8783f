"""The checked reader of an atlas folder (`qkinspect atlas --out`): every file checked where it enters (the manifest
by `qkinspect.atlas.folder`, the models' analyses by the sweep's checks, the saved analyses by
`qkinspect.analysis.saved`), the records computed again from them (`qkinspect.atlas.stats`).

Example:
    >>> atlas = read_atlas("atlas/")  # doctest: +SKIP
    >>> atlas.to_pandas().query("metric == 'symmetry' and scope == 'model'")  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qkinspect.atlas.folder import is_atlas
from qkinspect.atlas.results import AtlasResult


def read_atlas(folder: str | Path) -> AtlasResult:
    """The atlas in `folder` (qkinspect atlas --out), every file checked where it enters (qkinspect.atlas.folder).

    Raises:
        InputError: not an atlas folder, or one of its files is not what it is filed as.
    """
    from qkinspect.analysis.saved import read_saved
    from qkinspect.atlas import folder as store
    from qkinspect.atlas.stats import entry_relations, entry_stats
    from qkinspect.sweep import read_sweep

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
            doc = read_saved(folder / e["file"]).document()
            if doc["heads"] and "previous_token" in doc["heads"][0]:  # a heads document's copy keeps its relations
                from qkinspect.atlas.behaviour import saved_relations

                doc = {**doc, "relations": saved_relations(folder / e["file"], doc)}
            docs.append((e, doc))
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
        atlas.relations += entry_relations(name, doc, path=e["name"])
        error = (doc.get("behaviour") or {}).get("error")
        if error:
            atlas.notes.append(f"{e['name']}: no behaviour scores: {error}")
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

# The two verbs every capability's saved module offers (qkinspect.capabilities): read one back, and whether a
# model argument is one of its own. The names above stay, as they were published.
read = read_atlas
is_saved = is_atlas
