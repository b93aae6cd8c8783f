"""The twins' records: typed, frozen, one per tidy row (docs/twin.md, "Output").

- `RunPoint` (kind "runs"): one evaluation of one run: variant, seed, lr, step, tokens seen, training loss (the
  mean of the steps since the last evaluation), held-out loss (nats per token), free parameters, seconds since the
  run began, and the held-out loss in bits per byte.
- `TrajectoryPoint` (kind "trajectories"): one head's metric at one tracked step (`--track-every`).
- `VariantSummary` (kind "summary"): a variant at its chosen learning rate over the seeds (qkinspect.twin.summary).
- `LrTrial` (kind "lr"): seed 0's final held-out loss at each learning rate tried, and which was chosen.
- `TwinRun`: one finished run (its constraint check, timing, checkpoint); `Failure`: a run that raised.
`TwinResult` holds them all with the setup (text, tokenizer, model config, evaluation windows) and is what
`qkinspect.twin` returns and `qkinspect.twin.saved.read` reads back from the folder.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from qkinspect.documents import envelope, json_safe
from qkinspect.notebook import Tabular

KIND = "twin"  # the document -o writes (the folder's own files: qkinspect.twin.folder)
ROW_KINDS = ("runs", "trajectories", "summary", "lr")


@dataclass(frozen=True)
class RunPoint:
    variant: str
    seed: int
    lr: float
    step: int
    tokens: int
    train_loss: float | None
    val_loss: float
    params: int
    seconds: float
    val_bpb: float | None = None  # val_loss in bits per byte of the held-out text (qkinspect.twin.saved.bits_per_byte)


@dataclass(frozen=True)
class TrajectoryPoint:
    variant: str
    seed: int
    lr: float
    step: int
    layer: int
    head: int
    metric: str
    value: float | None


@dataclass(frozen=True)
class TwinRun:
    variant: str
    seed: int
    lr: float
    params: int
    val_loss: float
    train_loss: float | None
    seconds: float
    step_seconds: float | None  # median seconds per optimizer step
    violation: float  # the largest departure from the constraint at the evaluated steps (0 for standard)
    checkpoint: str | None  # the folder under the twin folder, with --save-checkpoints
    note: str | None  # what its checkpoint does not carry (the Reformer's attention), or why analyze cannot read it
    threads: int
    init: str = "nearest"  # its start: draw or nearest (qkinspect.twin.model); a folder from before --init: nearest
    val_bpb: float | None = None  # val_loss in bits per byte of the held-out text


@dataclass(frozen=True)
class VariantSummary:
    """A variant at its learning rate over its seeds against the standard twin (qkinspect.twin.summary): the
    interval is the 90 % t-interval the two one-sided tests use; the p-values are one-sided p-values, raw
    (`p_one_sided_*`) and Holm-adjusted over the constrained variants (`p_holm_*`, what the verdict uses); the
    slope is the gap's change per 1000 steps over the last evaluations (from step `slope_from`), with its 90 %
    interval over seeds. `*_bpb`: in bits per byte of the held-out text (None where the folder does not say its
    bytes)."""

    variant: str
    params: int
    lr: float
    seeds: int
    init: str  # its runs' start (TwinRun.init)
    val_loss: float | None  # mean over seeds
    val_losses: tuple[float, ...]  # each seed's, in seed order
    val_bpb: float | None  # val_loss in bits per byte
    diff: float | None  # mean of (variant − standard), paired by seed
    ci_low: float | None
    ci_high: float | None
    diff_bpb: float | None  # diff in bits per byte
    p_one_sided_better: float | None
    p_one_sided_not_worse: float | None
    p_one_sided_worse: float | None
    p_holm_better: float | None
    p_holm_not_worse: float | None
    p_holm_worse: float | None
    verdict: str  # better / not worse / worse / can't tell ("reference" for standard), from the Holm p-values
    steps_to_standard: int | None
    slope: float | None  # nats per 1000 steps, mean over seeds
    slope_low: float | None
    slope_high: float | None
    slope_from: int | None  # the first step of the evaluations the slope is fitted over


@dataclass(frozen=True)
class LrTrial:
    variant: str
    lr: float
    val_loss: float | None
    chosen: bool


@dataclass(frozen=True)
class Failure:
    variant: str
    seed: int
    lr: float
    error: str


@dataclass(frozen=True)
class TwinResult(Tabular):
    """Everything a twin folder holds. `setup`: the text (name, sha256, characters, how it is split, demo or not),
    the tokenizer (kind, vocabulary, sha256), the model (arch and its transformers config), the training (steps,
    warm-up, batch), the evaluation windows and the plan (variants, seeds, learning rates, margin); `notes`: what
    the reader should know."""

    folder: Path
    setup: dict[str, Any]
    runs: tuple[TwinRun, ...]
    points: tuple[RunPoint, ...]
    trajectories: tuple[TrajectoryPoint, ...]
    summaries: tuple[VariantSummary, ...]
    lr_sweep: tuple[LrTrial, ...]
    failures: tuple[Failure, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def rows(self, kind: str = "runs") -> list[dict[str, Any]]:
        """The tidy rows of one kind: runs, trajectories, summary or lr."""
        from qkinspect.errors import InputError

        chosen = {"runs": self.points, "trajectories": self.trajectories, "summary": self.summaries,
                  "lr": self.lr_sweep}.get(kind)
        if chosen is None:
            raise InputError(f"kind={kind!r}: expected one of {', '.join(ROW_KINDS)}")
        return [asdict(r) for r in chosen]

    def document(self) -> dict[str, Any]:
        """The document `-o FILE.json` and `save("x.json")` write (schema qkinspect/1, kind twin)."""
        return json_safe(envelope(KIND, folder=str(self.folder), setup=self.setup,
                                  runs=[asdict(r) for r in self.runs], points=self.rows("runs"),
                                  trajectories=self.rows("trajectories"), summary=self.rows("summary"),
                                  lr_sweep=self.rows("lr"), failures=[asdict(f) for f in self.failures],
                                  notes=list(self.notes)))

    to_dict = document  # deprecated: its name before every result's document was `document()` (docs/notebook.md)

    PARQUET = True

    def save(self, path: str | Path, rows: str = "runs") -> Path:
        """Write the twin to `path` (atomically) as `qkinspect twin -o path --rows ROWS` writes it, in the format the
        extension names: `.json` `document()`, `.csv`, `.ndjson`/`.jsonl` and `.parquet` (needs pyarrow) the rows of
        kind `rows` (runs, trajectories, summary or lr), `.txt` the table. Returns the path.

        Raises:
            InputError: an extension that names no format (naming the path), an unknown `rows`, Parquet without
                pyarrow.
            OutputError: the file cannot be written.
        """
        return save_rows(self, path, rows)

    def table_rows(self) -> list[dict[str, Any]]:
        return self.rows("summary")

    def render_table(self, console) -> None:
        from qkinspect.terminal.twin import render_twin

        render_twin(console, self.rows("summary"), self.rows("lr"), list(self.notes),
                    [asdict(f) for f in self.failures])

    def to_pandas(self, kind: str = "runs"):
        """One kind of tidy rows (runs, trajectories, summary, lr) as a pandas DataFrame; a kind with no rows
        (trajectories without tracking) is a frame of its columns and no rows."""
        from dataclasses import fields

        from qkinspect.notebook import data_frame

        rows = self.rows(kind)
        record = {"runs": RunPoint, "trajectories": TrajectoryPoint, "summary": VariantSummary, "lr": LrTrial}[kind]
        return data_frame(rows, f"to_pandas({kind!r})", [f.name for f in fields(record)])

    def __repr__(self) -> str:
        """One line: the folder, its runs and each variant's verdict (the records are in `runs`, `points`, ...)."""
        plan = self.setup.get("plan", {}) if isinstance(self.setup, dict) else {}
        verdicts = ", ".join(f"{s.variant} {s.verdict}" + ("" if s.diff is None else f" {s.diff:+.4f}")
                             for s in self.summaries if s.variant != "standard")
        failed = f", {len(self.failures)} failed" if self.failures else ""
        from qkinspect.terminal.twin import plural

        seeds = plan.get("seeds")
        seeds = plural(seeds, "seed") if isinstance(seeds, int) else "? seeds"
        return f"Twin({str(self.folder)!r}: {plural(len(self.runs), 'run')}{failed}, {seeds}; " \
               f"{verdicts or 'no variant compared'})"


def save_rows(result: Any, path: str | Path, rows: str) -> Path:
    """`result.save(path, rows)` for the twin's results (TwinResult, and the ladder's LadderResult): the format the
    extension names, the rows of kind `rows` (refused before anything is written where unknown)."""
    from qkinspect.formats import save_result

    result.rows(rows)
    return save_result(path, document=result.document, rows=lambda: result.rows(rows), render=result.render_table,
                       parquet=lambda: result.rows(rows))


Twin = TwinResult  # its name before results were named <Capability>Result (kept: users import it)
