"""The ladder: the twin at several model sizes in one folder (docs/twin.md, "Scale").

`shapes="2x64,4x128,6x192"` names the rungs, layers × d_model each. The head size is kept from rung to rung
(`head_size`, default 32: n_heads = d_model / head_size) unless `heads` is given, which then applies to every rung
as it does to one shape. `tokens_per_param=R` sets each rung's steps so that its training tokens (steps × batch ×
context) are about R × its non-embedding parameters (the standard twin's, every parameter but the token and
position embeddings and the output head); a fixed `steps` applies to every rung instead.

One shape is today's twin folder, exactly (the rung's sizes become `layers`, `d_model`, `heads`). Several are a
ladder folder: `ladder.json` (the rungs, the plan) and one twin folder per rung, `DIR/<L>x<D>/`, each a complete twin
folder that `plot`, `report` and `read_twin` open on its own. Each rung is the per-shape twin (`qkinspect.twin`)
run in turn into its folder, so resuming, failures and the per-shape summary are the twin's own; the ladder adds
the per-rung records (`ShapeSummary`) and the scaling fit per variant (`qkinspect.twin.scaling`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from qkinspect.documents import envelope, json_safe
from qkinspect.errors import InputError
from qkinspect.names import Names
from qkinspect.notebook import Tabular
from qkinspect.twin.folder import is_twin_folder
from qkinspect.twin.request import LIBRARY_NAMES, MAX_STEPS, Shape

LADDER = "ladder.json"
LADDER_KIND = "twin-ladder"
HEAD_SIZE = 32  # the head size a ladder keeps where neither heads nor head_size is given (4 × 128's)
DEFAULT_HEADS = 4  # one shape's heads where neither is given (today's twin)
DEFAULT_STEPS = 2000
_SHAPE = re.compile(r"([0-9]{1,4})x([0-9]{1,6})")


@dataclass(frozen=True)
class Rung:
    """One shape of the ladder, resolved: its sizes and steps; `folder`: its twin folder's name in the ladder."""

    layers: int
    d_model: int
    heads: int
    steps: int
    non_embedding_params: int | None = None  # known where tokens_per_param set the steps (else read back)

    @property
    def name(self) -> str:
        return f"{self.layers}x{self.d_model}"


def is_ladder_folder(path: Any) -> bool:
    return isinstance(path, (str, Path)) and (Path(path) / LADDER).is_file()


def parse_shapes(shapes: str | Sequence[str], names: Names = LIBRARY_NAMES) -> tuple[tuple[int, int], ...]:
    """`"2x64,4x128"` (or a list of such texts) as (layers, d_model) pairs, each once, in the order given."""
    texts = shapes.split(",") if isinstance(shapes, str) else list(shapes)
    out: list[tuple[int, int]] = []
    for text in texts:
        t = text.strip() if isinstance(text, str) else text
        if t == "":
            continue
        m = _SHAPE.fullmatch(t) if isinstance(t, str) else None
        if m is None or int(m.group(1)) < 1 or int(m.group(2)) < 2:
            raise InputError(f"{names.said('shapes', shapes)}: {t!r} is not a shape; expected layers x d_model, "
                             "e.g. 2x64,4x128,6x192")
        pair = (int(m.group(1)), int(m.group(2)))
        if pair not in out:
            out.append(pair)
    if not out:
        raise InputError(f"{names.said('shapes', shapes)}: give at least one shape, e.g. 2x64,4x128")
    return tuple(out)


def resolve(*, shapes: str | Sequence[str] | None, layers: int, d_model: int, heads: int | None,
            head_size: int | None, steps: int | None, tokens_per_param: float | None, config: str | Path | None,
            names: Names = LIBRARY_NAMES) -> list[Rung]:
    """The rungs asked for (one without `shapes`: today's twin), each with its heads and the fixed steps (`budget`
    sets them from `tokens_per_param`); InputError naming the option where the shapes, the head size or the budget
    cannot be honoured. Nothing is counted, trained or written."""
    pairs = parse_shapes(shapes, names) if shapes is not None else ((layers, d_model),)
    if shapes is not None and config is not None:
        raise InputError(f"{names.said('shapes', shapes)}: {names.said('config', config)} fixes the model's shape; "
                         "give one of them")
    if heads is not None and head_size is not None:
        raise InputError(f"{names.said('head_size', head_size)}: {names.said('heads', heads)} is given too; "
                         "give one of them")
    if head_size is not None and (isinstance(head_size, bool) or not isinstance(head_size, int) or head_size < 1):
        raise InputError(f"{names.said('head_size', head_size)}: expected a whole number, 1 or more")
    if steps is not None and tokens_per_param is not None:
        raise InputError(f"{names.said('tokens_per_param', tokens_per_param)}: {names.said('steps', steps)} is "
                         "given too; the budget is one or the other")
    if tokens_per_param is not None and (isinstance(tokens_per_param, bool)
                                         or not isinstance(tokens_per_param, (int, float))
                                         or not 0 < tokens_per_param < math.inf):
        raise InputError(f"{names.said('tokens_per_param', tokens_per_param)}: expected a number above 0 (training "
                         "tokens per non-embedding parameter)")
    rungs = []
    for n_layers, width in pairs:
        if heads is not None:
            n_heads = heads
        elif head_size is None and len(pairs) == 1 and shapes is None:
            n_heads = DEFAULT_HEADS
        else:
            size = head_size or HEAD_SIZE
            if width % size:
                said = names.said('head_size', size) if head_size else \
                    f"the head size {size} (the default; {names.head_size} or {names.heads} sets it)"
                raise InputError(f"{said}: does not divide d_model {width} of {n_layers}x{width} "
                                 f"({names.said('shapes', shapes) if shapes is not None else names.d_model})")
            n_heads = width // size
        rungs.append(Rung(n_layers, width, n_heads, DEFAULT_STEPS if steps is None else steps))
    return rungs


def budget(rungs: Sequence[Rung], tokens_per_param: float | None, *, arch: str, context: int, batch: int,
           config: str | Path | None, names: Names = LIBRARY_NAMES) -> list[Rung]:
    """The rungs with their non-embedding parameters counted (a ladder, or a budget in tokens per parameter) and,
    with `tokens_per_param`, their steps: round(R × N / (batch × context)), at least 1. Call it once the rungs'
    sizes are checked (`check_request`)."""
    if tokens_per_param is None and len(rungs) == 1:
        return list(rungs)  # today's twin: nothing counted
    out = []
    for r in rungs:
        n = non_embedding_params(Shape(arch, r.layers, r.d_model, r.heads, context,
                                       Path(config) if config is not None else None), names)
        steps = r.steps if tokens_per_param is None else \
            min(MAX_STEPS, max(1, round(tokens_per_param * n / (batch * context))))
        out.append(Rung(r.layers, r.d_model, r.heads, steps, n))
    return out


def non_embedding_params(shape: Shape, names: Names = LIBRARY_NAMES) -> int:
    """The standard twin's parameters but its token and position embeddings and its output head (independent of the
    vocabulary). Counted on a model built on the meta device: nothing is allocated."""
    import torch

    from qkinspect.twin.model import config_for, standard_model

    if shape.config is None and (shape.d_model % shape.heads or (shape.arch == "llama"
                                                                 and (shape.d_model // shape.heads) % 2)):
        return 0  # the request's own check names the option (check_request)
    cfg = config_for(shape, 256, names=names)  # any vocabulary: its tensors are not counted
    with torch.device("meta"):
        model = standard_model(cfg, 0)
    return count_non_embedding(model)


def count_non_embedding(model) -> int:
    from torch import nn

    skip = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    head = model.get_output_embeddings()
    if head is not None:
        skip |= {id(p) for p in head.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


# -- records -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShapeSummary:
    """One variant at one rung: the rung (`shape` as LxD, its layers, d_model, heads), the standard twin's
    parameters and non-embedding parameters there, the training tokens of each run (steps × batch × context), and
    the per-shape summary of the variant (`summary`, qkinspect.twin.results.VariantSummary: params, diff, ci_low,
    ci_high, verdict ... as the twin reports one shape). Its row is the rung's fields then the summary's."""

    shape: str
    layers: int
    d_model: int
    heads: int
    standard_params: int
    non_embedding_params: int
    steps: int
    tokens: int
    summary: Any  # VariantSummary

    def row(self) -> dict[str, Any]:
        rung = {k: v for k, v in asdict(self).items() if k != "summary"}
        return {**rung, **asdict(self.summary)}


LADDER_ROW_KINDS = ("summary", "scaling", "runs", "trajectories", "lr")


@dataclass(frozen=True)
class LadderResult(Tabular):
    """A ladder folder read back: each rung's twin (`twins`, in the ladder's order, with `rungs`), the per-rung
    records (`summaries`) and a scaling fit per constrained variant (`fits`, qkinspect.twin.scaling.ScalingFit)."""

    folder: Path
    rungs: tuple[Rung, ...]
    twins: tuple[Any, ...]  # TwinResult, one per rung
    summaries: tuple[ShapeSummary, ...]
    fits: tuple[Any, ...]  # ScalingFit
    tokens_per_param: float | None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def failures(self) -> tuple[Any, ...]:
        return tuple(f for t in self.twins for f in t.failures)

    @property
    def level(self) -> float:
        """The level of each shape's interval: the verdicts' (qkinspect.twin.summary.LEVEL)."""
        from qkinspect.twin.summary import LEVEL

        return LEVEL

    @property
    def margin(self) -> float:
        return float(self.twins[0].setup["plan"]["margin"]) if self.twins else 0.0

    def rows(self, kind: str = "summary") -> list[dict[str, Any]]:
        """The tidy rows of one kind: summary (per shape and variant), scaling (per variant), or each rung's runs,
        trajectories or lr rows with the rung's `shape` first."""
        if kind == "summary":
            return [s.row() for s in self.summaries]
        if kind == "scaling":
            return [f.row() for f in self.fits]
        if kind in ("runs", "trajectories", "lr"):
            return [{"shape": r.name, **row} for r, t in zip(self.rungs, self.twins, strict=True)
                    for row in t.rows(kind)]
        raise InputError(f"kind={kind!r}: expected one of {', '.join(LADDER_ROW_KINDS)}")

    def document(self) -> dict[str, Any]:
        """The document `-o FILE.json` and `save("x.json")` write (schema qkinspect/1, kind twin-ladder)."""
        return json_safe(envelope("twin-ladder", folder=str(self.folder), tokens_per_param=self.tokens_per_param,
                                  shapes=[asdict(r) | {"name": r.name} for r in self.rungs],
                                  summary=self.rows("summary"), scaling=self.rows("scaling"),
                                  twins={r.name: t.document() for r, t in zip(self.rungs, self.twins, strict=True)},
                                  notes=list(self.notes)))

    to_dict = document  # deprecated: its name before every result's document was `document()` (docs/notebook.md)

    def save(self, path: str | Path, rows: str = "summary") -> Path:
        """Write the ladder to `path` as `qkinspect twin --shapes ... -o path --rows ROWS` writes it, in the format the
        extension names (qkinspect.formats): `.json` `document()`, `.csv`, `.ndjson` and `.parquet` the rows of kind
        `rows`, `.txt` the table. Returns the path."""
        from qkinspect.twin.results import save_rows

        return save_rows(self, path, rows)

    def table_rows(self) -> list[dict[str, Any]]:
        return self.rows("summary")

    def render_table(self, console) -> None:
        from qkinspect.terminal.twin import render_ladder

        render_ladder(console, self)

    def to_pandas(self, kind: str = "summary"):
        from qkinspect.notebook import data_frame

        return data_frame(self.rows(kind), f"to_pandas({kind!r})")


# -- running and reading -----------------------------------------------------------------------------------------


def write_manifest(folder: Path, rungs: Sequence[Rung], tokens_per_param: float | None, names: Names) -> None:
    """The ladder's manifest: the rungs in order and how their steps were set."""
    from qkinspect.sweep.store import write_json

    if folder.exists() and not folder.is_dir():
        raise InputError(f"{names.said('out', folder)}: not a folder")
    if is_twin_folder(folder):
        raise InputError(f"{names.said('out', folder)}: holds a one-shape twin; choose another folder for a ladder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"{names.said('out', folder)}: cannot create the ladder folder ({e.strerror or e})") from None
    previous = _manifest(folder) if (folder / LADDER).is_file() else {}
    known = {s["name"]: s for s in previous.get("shapes", []) if isinstance(s, dict) and "name" in s}
    for r in rungs:
        known[r.name] = asdict(r) | {"name": r.name, "folder": r.name}
    order = [r.name for r in rungs] + [k for k in known if k not in {r.name for r in rungs}]
    write_json(folder / LADDER, json_safe({"schema": "qkinspect/1", "kind": LADDER_KIND,
                                           "tokens_per_param": tokens_per_param,
                                           "shapes": [known[k] for k in order]}))


def read_ladder(folder: str | Path) -> LadderResult:
    """A ladder folder's rungs read back, checked (each rung's twin folder by `read_twin`), with the per-rung
    records and the scaling fits."""
    from qkinspect.twin.saved import read_twin
    from qkinspect.twin.scaling import fit_variant

    folder = Path(folder)
    doc = _manifest(folder)
    where = folder / LADDER
    rungs, twins, notes = [], [], []
    shapes = doc.get("shapes")
    if not isinstance(shapes, list) or not shapes:
        raise InputError(f"{where}: shapes: expected a list of the ladder's shapes")
    for s in shapes:
        rung = _rung(s, where)
        sub = folder / rung.name
        if not is_twin_folder(sub):
            notes.append(f"{rung.name}: not started yet")
            continue
        twin = read_twin(sub)
        if not twin.runs:
            notes.append(f"{rung.name}: no run finished yet")
        rungs.append(rung)
        twins.append(twin)
        notes += [f"{rung.name}: {n}" for n in twin.notes]
    summaries = []
    for rung, twin in zip(rungs, twins, strict=True):
        summaries += shape_summaries(rung, twin)
    variants = list(dict.fromkeys(s.summary.variant for s in summaries if s.summary.variant != "standard"))
    fits = tuple(fit_variant(v, per_seed_gaps(rungs, twins, v))[0] for v in variants)
    tpp = doc.get("tokens_per_param")
    if tpp is not None and (isinstance(tpp, bool) or not isinstance(tpp, (int, float)) or not math.isfinite(tpp)):
        raise InputError(f"{where}: tokens_per_param: expected a number or null")
    return LadderResult(folder, tuple(rungs), tuple(twins), tuple(summaries), fits, tpp, tuple(dict.fromkeys(notes)))


def shape_summaries(rung: Rung, twin) -> list[ShapeSummary]:
    """The twin's per-shape summary, each variant with its rung's sizes, parameters and tokens."""
    setup = twin.setup
    training = setup.get("training", {})
    steps, batch, context = training.get("steps"), training.get("batch"), training.get("context")
    tokens = steps * batch * context if all(isinstance(x, int) for x in (steps, batch, context)) else 0
    std = [r for r in twin.runs if r.variant == "standard"]
    params = std[0].params if std else 0
    return [ShapeSummary(rung.name, rung.layers, rung.d_model, rung.heads, params, rung.non_embedding_params or 0,
                         steps or 0, tokens, s) for s in twin.summaries]


def per_seed_gaps(rungs: Sequence[Rung], twins: Sequence[Any], variant: str) -> list[tuple[str, int, list[float]]]:
    """For each rung where the variant and the standard twin both finished a seed (at the variant's chosen rate and
    the standard's): its name, its non-embedding parameters and the paired gaps, variant − standard, one per seed."""
    out = []
    for rung, twin in zip(rungs, twins, strict=True):
        chosen = {s.variant: s.lr for s in twin.summaries}
        if variant not in chosen or "standard" not in chosen:
            continue
        std = {r.seed: r.val_loss for r in twin.runs if r.variant == "standard" and r.lr == chosen["standard"]}
        mine = {r.seed: r.val_loss for r in twin.runs if r.variant == variant and r.lr == chosen[variant]}
        seeds = sorted(set(std) & set(mine) & set(range(twin.setup["plan"]["seeds"])))
        if seeds and rung.non_embedding_params:
            out.append((rung.name, rung.non_embedding_params, [mine[s] - std[s] for s in seeds]))
    return out


def _manifest(folder: Path) -> dict[str, Any]:
    import os

    from qkinspect.reading import read_json

    path = folder / LADDER
    if not os.path.lexists(path):
        raise InputError(f"{path}: no such file (not a ladder folder?)")
    if os.path.islink(path):
        raise InputError(f"{path}: is a link; a ladder's manifest is a regular file")
    doc = read_json(path, what="a twin ladder's manifest")  # bounded in size and depth, regular files only
    if not isinstance(doc, dict) or doc.get("kind") != LADDER_KIND:
        raise InputError(f"{path}: kind: not a twin ladder's manifest")
    return doc


def _rung(s: Any, where: Path) -> Rung:
    if not isinstance(s, dict):
        raise InputError(f"{where}: shapes: each shape is an object")
    vals = {}
    for k in ("layers", "d_model", "heads", "steps"):
        v = s.get(k)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InputError(f"{where}: shapes.{k}: expected a whole number, 1 or more")
        vals[k] = v
    n = s.get("non_embedding_params")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputError(f"{where}: shapes.non_embedding_params: expected a whole number, 1 or more")
    rung = Rung(vals["layers"], vals["d_model"], vals["heads"], vals["steps"], n)
    if s.get("name") != rung.name or s.get("folder", rung.name) != rung.name:
        raise InputError(f"{where}: shapes.name: expected {rung.name} (its layers x d_model)")
    return rung


def run_ladder(out: Path, rungs: Sequence[Rung], tokens_per_param: float | None, options: dict[str, Any],
               progress, names: Names, train, notice=None) -> LadderResult:
    """Every rung's request checked, then the manifest written and each rung's twin trained into its folder by
    `train` (qkinspect.twin.run.twin, passed in so that the two modules read one way), in turn (`options`: the twin's
    other arguments); the ladder read back. `progress` (qkinspect.progress) is each
    rung's twin's; `notice` gets the lines the CLI prints, each under its rung's name."""
    from qkinspect.twin.request import check_request

    for r in rungs:
        check_request(out / r.name, layers=r.layers, d_model=r.d_model, heads=r.heads, steps=r.steps, names=names,
                      **{k: v for k, v in options.items() if k in _REQUEST})
    write_manifest(out, rungs, tokens_per_param, names)
    say = notice or (lambda line: None)
    for r in rungs:
        say(f"{r.name}: {r.heads} heads, {r.non_embedding_params:,} non-embedding parameters, {r.steps} steps")
        train(out / r.name, layers=r.layers, d_model=r.d_model, heads=r.heads, steps=r.steps, names=names,
             progress=progress, notice=lambda line, name=r.name: say(f"{name}: {line}"), **options)
    return read_ladder(out)


_REQUEST = ("variants", "match_params", "arch", "context", "config", "text", "tokenizer", "seeds", "lr", "warmup",
            "batch", "eval_every", "eval_windows", "track_every", "margin", "save_checkpoints", "scheduler",
            "workers", "threads", "device", "init", "schedule", "stack", "precision", "compile")

# The two verbs every capability's saved module offers (qkinspect.capabilities): read one back, and whether a
# model argument is one of its own. The names above stay, as they were published.
read = read_ladder
is_saved = is_ladder_folder

Ladder = LadderResult  # its name before results were named <Capability>Result (kept: users import it)
