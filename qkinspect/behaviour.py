"""What an atlas run with behaviour scores stores, as the names of those scores and the checks of a stored
result (torch-free, importing nothing of the capability packages), so that the sweep's reader
(qkinspect.sweep.verify) checks an atlas's behaviour results without importing `heads` or the atlas: the heads'
six score names (`SCORES`, heads' records use them), the relations an atlas keeps per model (`KEPT_SCOPES`), the
amounts it stores (`AMOUNTS`, `SETTING_NAMES`); `check_settings`, `check_result`, `check_relations`.
"""

from __future__ import annotations

from typing import Any

from qkinspect.checking import Checker, show
from qkinspect.limits import MAX_METRIC

SCORES = ("previous_token", "induction", "duplicate_token", "self", "first_token", "entropy")
KEPT_SCOPES = ("all", "within")  # the relations an atlas keeps per model (per layer: in a heads document)
AMOUNTS = ("sequences", "length", "seed", "windows", "window", "resamples", "permutations")
SETTING_NAMES = (*AMOUNTS, "relate")
MAX_RELATIONS = 1 << 16


def check_settings(c: Checker, value: Any, key: str) -> dict[str, Any]:
    """The behaviour settings stored in a result's or a manifest's options."""
    got = c.obj(value, key)
    if set(got) != set(SETTING_NAMES):
        raise c.fail(key, f"holds {', '.join(sorted(map(str, got)))}, not {', '.join(SETTING_NAMES)}")
    for name in AMOUNTS:
        c.index(got[name], f"{key}.{name}", null=False, below=1 << 63)
    relate = got["relate"]
    if not isinstance(relate, list) or len(relate) > 1000:
        raise c.fail(f"{key}.relate", f"is {show(relate)}, not a list of metric names")
    for i, m in enumerate(relate):
        c.text(m, f"{key}.relate[{i}]")
    return got


def check_result(c: Checker, result: dict[str, Any], blocks: dict[str, tuple[int, int]]) -> None:
    """A stored result of an atlas run with behaviour: its `behaviour` (settings, error) and its relations (known
    scores and scopes, a block of the model, ρ, interval and p in range, n a count of heads); the scores in the
    head records are checked as every per-head value is (finite numbers or null)."""
    state = c.obj(result.get("behaviour"), "result.behaviour")
    c.text(state.get("error"), "result.behaviour.error", null=True)
    check_relations(c, result.get("relations", []), blocks, "result.relations")
    for i, row in enumerate(result.get("heads") or []):
        for s in SCORES:
            c.number(row.get(s), f"result.heads[{i}].{s}", low=-MAX_METRIC, high=MAX_METRIC)


def check_relations(c: Checker, relations: Any, blocks: dict[str, tuple[int, int]], key: str) -> list[dict]:
    """A list of relations (RelationRecord rows with their block; all heads and within layers) as stored."""
    if not isinstance(relations, list) or len(relations) > MAX_RELATIONS:
        raise c.fail(key, f"is {show(relations)}, not a list of relations")
    most = sum(n * h for n, h in blocks.values())
    out = []
    for i, r in enumerate(relations):
        where = f"{key}[{i}]"
        r = c.obj(r, where)
        if r.get("block") not in blocks:
            raise c.fail(f"{where}.block", f"is {show(r.get('block'))}, not a block of the model")
        c.text(r.get("metric"), f"{where}.metric")
        if r.get("score") not in SCORES:
            raise c.fail(f"{where}.score", f"is {show(r.get('score'))}, not one of {', '.join(SCORES)}")
        if r.get("scope") not in KEPT_SCOPES:
            raise c.fail(f"{where}.scope", f"is {show(r.get('scope'))}, not one of {', '.join(KEPT_SCOPES)}")
        if r.get("layer") is not None:
            raise c.fail(f"{where}.layer", f"is {show(r.get('layer'))}, not null (all heads, within layers)")
        for name in ("rho", "low", "high"):
            c.number(r.get(name), f"{where}.{name}", low=-1 - 1e-9, high=1 + 1e-9)
        c.number(r.get("p"), f"{where}.p", low=0, high=1)
        c.index(r.get("n"), f"{where}.n", null=False, below=most + 1)
        out.append(r)
    return out
