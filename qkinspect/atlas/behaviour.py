"""The atlas's behaviour scores (`qkinspect atlas --behaviour`, `behaviour=True`): `qkinspect.heads` run inside each
model's atlas task, its scores joined to the analysis's head records and its relations kept beside them
(docs/atlas.md, "Behaviour across models").

- `settings` (torch-free, checked before any work): the heads' amounts as the atlas stores them in its options
  (so the result key, and resuming, follow them): repeated random sequences, text windows, the weight metrics
  related (heads' three, those the atlas measures), resamples and permutations;
- `join` (in the task, on the worker): `heads` on the model with the atlas's metrics and folds; each head record
  of the analysis gains the six scores (the atlas's depth statistics then hold them, as for a weight metric), the
  result gains `relations` (Spearman's ρ over all heads and within layers, with interval and p: heads' own
  records) and `behaviour` (the settings, and `error`: why a model whose weights were analysed could not be run,
  e.g. a family transformers' eager kernel is not wired for; its weight records stay);
- the checks of a stored result (qkinspect.behaviour, where qkinspect.sweep.verify reads them).

Example:
    >>> settings(sequences=8, length=16)["sequences"]
    8
"""

from __future__ import annotations

from typing import Any

from qkinspect.behaviour import KEPT_SCOPES, check_relations
from qkinspect.checking import Checker
from qkinspect.names import Names
from qkinspect.sweep.names import LIBRARY_NAMES

# The heads' amounts in an atlas: small, as each model's task runs them (heads' own defaults: 64 x 2 x 64, 16 x 128).
SEQUENCES, LENGTH, SEED, WINDOWS, WINDOW, BATCH = 16, 32, 0, 8, 64, 8
RESAMPLES = PERMUTATIONS = 1000


def settings(*, sequences: int = SEQUENCES, length: int = LENGTH, seed: int = SEED,
             metrics: list[str] | None = None, names: Names = LIBRARY_NAMES) -> dict[str, Any]:
    """The behaviour settings an atlas stores in its options, checked as `heads` checks them (in the caller's
    option names); `relate`: heads' default metrics among those the atlas measures (`metrics`, None: analyze's
    defaults).

    Raises:
        InputError: naming sequences, length or seed.
    """
    from qkinspect.heads.request import RELATE, check_request
    from qkinspect.metrics.registry import resolve_metrics

    measured = resolve_metrics(metrics)
    relate = [m for m in RELATE if m in measured]
    request = check_request(sequences=sequences, length=length, seed=seed, windows=WINDOWS, window=WINDOW,
                            batch=BATCH, metrics=metrics, relate=relate, resamples=RESAMPLES,
                            permutations=PERMUTATIONS, names=names)
    return {"sequences": request.sequences, "length": request.length, "seed": request.seed,
            "windows": request.windows, "window": request.window, "relate": list(request.relate),
            "resamples": request.resamples, "permutations": request.permutations}


def join(spec: str, revision: str | None, result: dict[str, Any], behaviour: dict[str, Any],
         options: dict[str, Any], *, device: str = "cpu", threads: int | None = None) -> dict[str, Any]:
    """The analysis `result` (an `analyze` document) with the behaviour scores of `qkinspect.heads` on the same
    model joined to its head records, and its relations (all heads, within layers) beside them."""
    from qkinspect.errors import CheckpointError, InputError, UnsupportedModelError
    from qkinspect.heads.run import heads

    try:
        got = heads(spec, revision=revision, metrics=options.get("metrics"), fold_ln=bool(options.get("fold_ln")),
                    fold_qk_norm=bool(options.get("fold_qk_norm")), relate=behaviour["relate"] or None,
                    sequences=behaviour["sequences"], length=behaviour["length"], seed=behaviour["seed"],
                    windows=behaviour["windows"], window=behaviour["window"], batch=BATCH,
                    resamples=behaviour["resamples"], permutations=behaviour["permutations"], device=device,
                    threads=threads, layer_relations=False)
    except (InputError, UnsupportedModelError, CheckpointError) as e:  # the weights stay; the atlas says why
        return {**result, "behaviour": {**behaviour, "error": " ".join(str(e).split())}}
    scores = {(r.block, r.layer, r.head): r.scores for r in got.records}
    present = got.scores
    heads_rows = [{**row, **{s: v for s, v in scores.get((row["block"], row["layer"], row["head"]), {}).items()
                             if s in present}} for row in result["heads"]]
    relations = [{"block": got.records[0].block, **r.row()} for r in got.relations if r.scope in KEPT_SCOPES]
    return {**result, "heads": heads_rows, "relations": relations,
            "behaviour": {**behaviour, "error": None, "text": got.settings.text,
                          "text_windows": got.settings.windows, "causal": got.settings.causal}}


def saved_relations(path: Any, doc: dict[str, Any]) -> list[dict]:
    """The relations (all heads, within layers) a saved copy in an atlas folder holds: a heads document taken as
    a model keeps them (`HeadsResult.analysis_document`); an analysis has none. Checked against the model `doc`
    (the analysis the copy was read as)."""
    from qkinspect.reading import read_json

    raw = read_json(path, what="a saved analysis")
    if not isinstance(raw, dict) or "relations" not in raw:
        return []
    blocks = {b.get("label") or b["name"]: (b["n_layers"], b["n_heads"]) for b in doc["model"]["blocks"]}
    return check_relations(Checker(path), raw["relations"], blocks, "relations")
