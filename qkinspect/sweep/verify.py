"""Where a sweep folder's files enter: the manifest and each result are checked whole, and a result against the
checkpoint and options it claims, before anything trusts it (docs/sweep.md, "What a result must show").

A sweep folder is input like any other: files in it may be hand-edited, truncated, copied from elsewhere, or made to
make the tool misbehave. A result is trusted only when

- it is a regular file (not a link, a FIFO or a device) of valid JSON, `"kind": "sweep-result"`;
- its `key` is the key this sweep computes for the checkpoint and options;
- the checkpoint it records is this one: the same spec, revision, name and identity (for a local checkpoint the
  identity is its resolved path with a fingerprint of its config and weight files' names, sizes and modification
  times, so a result copied under another checkpoint's key, or a checkpoint rewritten since, does not match);
- the options it records are the sweep's options;
- the model its analysis describes is that checkpoint (its resolved `source` is the checkpoint's path) and its
  head, layer and baseline records are well-formed and within the model's shape (layers, heads, blocks), with
  finite numbers.

A resumed sweep computes a refused result again (and says so); `plot` and `report` refuse the folder, naming the
file and what is wrong.
"""

from __future__ import annotations

import os
from typing import Any

from qkinspect.checking import MAX_INDEX, Checker, model_blocks, show
from qkinspect.errors import InputError
from qkinspect.limits import MAX_METRIC
from qkinspect.selection import as_indexes
from qkinspect.sweep.checkpoints import Checkpoint
from qkinspect.sweep.keys import OPTION_NAMES, OPTIONAL_NAMES, RESULT_KIND, Failure, normalized_options, stored_key

MAX_CHECKPOINTS = 1 << 20
MAX_SELECTION_TEXT = 10_000  # a selection stored as text ("0-5,7") by an earlier version
MAX_RECORDS = 1 << 16  # head (or layer) records in one result: the largest models have ~16 000 heads
STEP_SOURCES = ("trainer_state", "name", "order", "training")  # training: qkinspect.track / QKCallback
IDENTITY_FIELDS = ("spec", "revision", "name", "identity")
HEAD_KEYS = ("block", "layer", "head", "kv_head")
LAYER_KEYS = ("block", "layer", "n_heads", "head_overlap")
RANKS = ("rank_q", "rank_k", "rank_v")


class ResultRefused(InputError):
    """A result file that is not a sweep result, or not the result of the checkpoint and options it is filed
    under (exit code 2 in `plot`/`report`; a resumed sweep computes it again)."""


def check_options(c: Checker, options: Any, key: str = "options") -> dict[str, Any]:
    """The sweep's analysis options (keys.normalized_options' form) with the types the analysis takes."""
    opts = c.obj(options, key)
    if set(opts) - set(OPTIONAL_NAMES) != set(OPTION_NAMES):
        missing, extra = set(OPTION_NAMES) - set(opts), set(opts) - set(OPTION_NAMES) - set(OPTIONAL_NAMES)
        raise c.fail(key, "lack " + ", ".join(sorted(missing)) if missing else "hold unknown "
                     + ", ".join(sorted(extra)))
    for name in ("layers", "heads"):
        v = opts[name]
        if isinstance(v, str) and len(v) <= MAX_SELECTION_TEXT:  # as an earlier version stored "0-1": read it
            try:
                as_indexes(v, name)
            except InputError as e:
                raise c.fail(f"{key}.{name}", f"is {show(v)}, not a selection ({e})") from None
        elif v is not None:
            if not isinstance(v, list) or len(v) > MAX_INDEX:
                raise c.fail(f"{key}.{name}", f"is {show(v)}, not a list of numbers or null")
            for i, x in enumerate(v):
                c.index(x, f"{key}.{name}[{i}]", null=False)
    for name in ("blocks", "metrics"):
        v = opts[name]
        if v is not None:
            if not isinstance(v, list) or len(v) > 1000:
                raise c.fail(f"{key}.{name}", f"is {show(v)}, not a list of names or null")
            for i, x in enumerate(v):
                c.text(x, f"{key}.{name}[{i}]")
    c.text(opts["precision"], f"{key}.precision")
    for name in ("fold_ln", "fold_qk_norm", "layer_form"):
        if not isinstance(opts[name], bool):
            raise c.fail(f"{key}.{name}", f"is {show(opts[name])}, not true or false")
    if "behaviour" in opts:
        from qkinspect.behaviour import check_settings

        check_settings(c, opts["behaviour"], f"{key}.behaviour")
    return opts


def check_manifest(doc: Any, path: object):
    """(checkpoints with their result keys, options, failures) from a sweep.json; InputError naming the file and
    the key when it is not a sweep manifest or a checkpoint's key is not the one its identity and the options
    give."""
    c = Checker(path)
    if not isinstance(doc, dict) or doc.get("kind") != "sweep":
        raise InputError(f"{path}: not a qkinspect sweep manifest (no \"kind\": \"sweep\")")
    options = check_options(c, doc.get("options"))
    cks = doc.get("checkpoints")
    if not isinstance(cks, list) or len(cks) > MAX_CHECKPOINTS:
        raise c.fail("checkpoints", f"is {show(cks)}, not a list of checkpoints")
    out = []
    for i, item in enumerate(cks):
        where = f"checkpoints[{i}]"
        item = c.obj(item, where)
        fields = {f: c.text(item.get(f), f"{where}.{f}", null=f == "revision") for f in IDENTITY_FIELDS}
        if not fields["spec"] or not fields["identity"]:
            raise c.fail(f"{where}.{'spec' if not fields['spec'] else 'identity'}", "is empty")
        step = c.index(item.get("step"), f"{where}.step", null=False, below=1 << 62)
        source = item.get("step_source")
        if source not in STEP_SOURCES:
            raise c.fail(f"{where}.step_source", f"is {show(source)}, not one of {', '.join(STEP_SOURCES)}")
        ck = Checkpoint(**fields, step=step, step_source=source)
        key = c.text(item.get("key"), f"{where}.key")
        if key != stored_key(ck, options):  # the options as stored: a folder of an earlier version keeps its keys
            raise c.fail(f"{where}.key", f"is {show(key)}, not the key of {ck.name} with these options")
        out.append((ck, key))
    failures = doc.get("failures", [])
    if not isinstance(failures, list) or len(failures) > MAX_CHECKPOINTS:
        raise c.fail("failures", f"is {show(failures)}, not a list")
    fails = []
    for i, f in enumerate(failures):
        f = c.obj(f, f"failures[{i}]")
        fails.append(Failure(c.text(f.get("checkpoint"), f"failures[{i}].checkpoint"),
                             c.text(f.get("error"), f"failures[{i}].error")))
    return out, normalized_options(options), fails


def check_result(doc: Any, path: object, ck: Checkpoint, key: str, options: dict[str, Any]) -> dict[str, Any]:
    """`doc` when it is the result of `ck` with `options` under `key` (see the module's docstring); ResultRefused
    naming the file and the key otherwise."""
    c = Checker(path, ResultRefused)
    if not isinstance(doc, dict) or doc.get("kind") != RESULT_KIND:
        raise ResultRefused(f"{path}: not a qkinspect sweep result (no \"kind\": \"{RESULT_KIND}\")")
    if doc.get("key") != key:
        raise c.fail("key", f"is {show(doc.get('key'))}, not {key} (the key of {ck.name} with this sweep's "
                            "options)")
    claimed = c.obj(doc.get("checkpoint"), "checkpoint")
    for f in IDENTITY_FIELDS:
        if claimed.get(f) != getattr(ck, f):
            raise c.fail(f"checkpoint.{f}", f"is {show(claimed.get(f), 400)}: the result is not of {ck.name} "
                                           f"({f} {show(getattr(ck, f), 400)})")
    if normalized_options(check_options(c, doc.get("options"))) != options:
        raise c.fail("options", "are not this sweep's options")
    result = c.obj(doc.get("result"), "result")
    blocks = model_blocks(c, result.get("model"), "result.model")
    _check_model_info(c, result["model"])
    _check_source(c, result["model"], ck)
    heads = _records(c, result.get("heads"), "result.heads", sum(n * h for n, h in blocks.values()))
    for i, r in enumerate(heads):
        where = f"result.heads[{i}]"
        n_layers, n_heads = _block(c, blocks, r, where)
        c.index(r.get("layer"), f"{where}.layer", null=False, below=n_layers)
        c.index(r.get("head"), f"{where}.head", null=False, below=n_heads)
        c.index(r.get("kv_head"), f"{where}.kv_head", null=False, below=n_heads)
        for rank in RANKS:
            c.index(r.get(rank), f"{where}.{rank}", null=True, below=MAX_INDEX + 1)
        _values(c, r, where, (*HEAD_KEYS, *RANKS))
    layers = _records(c, result.get("layers"), "result.layers", sum(n for n, _ in blocks.values()))
    for i, r in enumerate(layers):
        where = f"result.layers[{i}]"
        n_layers, n_heads = _block(c, blocks, r, where)
        c.index(r.get("layer"), f"{where}.layer", null=False, below=n_layers)
        n = c.index(r.get("n_heads"), f"{where}.n_heads", null=False, below=n_heads + 1)
        if "head_overlap" in r:
            _matrix(c, r["head_overlap"], f"{where}.head_overlap", n)
        _values(c, r, where, LAYER_KEYS)
    for i, b in enumerate(_records(c, result.get("baselines", []), "result.baselines", 64 * 1000)):
        where = f"result.baselines[{i}]"
        c.text(b.get("block"), f"{where}.block")
        c.text(b.get("metric"), f"{where}.metric")
        for name in ("mean", "std"):
            c.number(b.get(name), f"{where}.{name}", low=-MAX_METRIC, high=MAX_METRIC)
    if options.get("behaviour"):
        from qkinspect.behaviour import check_result as check_behaviour

        check_behaviour(c, result, blocks)
    for name in ("device", "worker"):
        c.text(doc.get(name), name, null=True)
    c.index(doc.get("threads"), "threads", null=True, below=1 << 20)
    c.number(doc.get("seconds"), "seconds", low=0, high=MAX_METRIC)
    return doc


def _check_model_info(c: Checker, model: dict) -> None:
    """The recorded model must rebuild as a ModelInfo (a resumed sweep compares the checkpoints' shapes)."""
    from qkinspect.documents import model_info

    try:
        model_info(model)
    except (TypeError, ValueError, KeyError, AttributeError, InputError) as e:
        raise c.fail("result.model", f"is not a model description ({type(e).__name__}: {e})") from None


def _check_source(c: Checker, model: dict, ck: Checkpoint) -> None:
    """A local checkpoint's result describes the files at the checkpoint's own path."""
    if ck.identity.startswith("hub:") or "#" not in ck.identity:
        return
    path = ck.identity.rsplit("#", 1)[0]
    source = model["source"]
    if os.path.realpath(source) != path:
        raise c.fail("result.model.source", f"is {show(source, 400)}: the result is not of {ck.name} ({path})")


def _records(c: Checker, records: Any, key: str, most: int) -> list[dict]:
    if not isinstance(records, list):
        raise c.fail(key, f"is {show(records)}, not a list of records")
    limit = min(most, MAX_RECORDS)
    if len(records) > limit:
        why = f"the model's shape allows ({most})" if limit == most else f"a result may hold ({MAX_RECORDS})"
        raise c.fail(key, f"has {len(records)} records, more than {why}")
    return [c.obj(r, f"{key}[{i}]") for i, r in enumerate(records)]


def _block(c: Checker, blocks: dict[str, tuple[int, int]], record: dict, where: str) -> tuple[int, int]:
    name = c.text(record.get("block"), f"{where}.block")
    if name not in blocks:
        raise c.fail(f"{where}.block", f"is {show(name)}, not a block of the model ({', '.join(blocks)})")
    return blocks[name]


def _values(c: Checker, record: dict, where: str, skip: tuple[str, ...]) -> None:
    for name, v in record.items():
        if name not in skip:
            c.number(v, f"{where}.{name}", low=-MAX_METRIC, high=MAX_METRIC)


def _matrix(c: Checker, m: Any, key: str, n: int) -> None:
    if not isinstance(m, list) or len(m) != n:
        raise c.fail(key, f"is {show(m)}, not {n} rows")
    for i, row in enumerate(m):
        if not isinstance(row, list) or len(row) != n:
            raise c.fail(f"{key}[{i}]", f"is {show(row)}, not {n} numbers")
        for j, v in enumerate(row):
            c.number(v, f"{key}[{i}][{j}]", low=-MAX_METRIC, high=MAX_METRIC)
