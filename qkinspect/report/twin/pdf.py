"""A twin folder's report (docs/twin.md), to the model report's standard: a first page saying what was
trained, on what and at what scale (and that the answer holds at that scale), the summary table and verdicts in
words, the learning-rate sweep, every run and failure; then one page per figure (learning, gap, each tracked
metric's trajectory) with its caption. Every page with the report's footer and number. The content functions
(`setup_pairs`, `summary_table`, …) are shared with the HTML page (qkinspect.report.analysis.html)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import IO, Any

from qkinspect.numbers import DECIMALS, plain, signed_alike
from qkinspect.report.style import fmt
from qkinspect.report.tables import Table
from qkinspect.report.twin.figures import (
    gap_caption,
    gap_figure,
    learning_caption,
    learning_figure,
    model_dims,
    trajectory_caption,
    trajectory_figure,
    twin_name,
)
from qkinspect.twin.curves import chosen, margin, seed_sd, tracked_metrics
from qkinspect.twin.results import TwinResult

# transformers' names for the sizes, llama's then gpt2's
SIZES = {"layers": ("num_hidden_layers", "n_layer"), "kv_heads": ("num_key_value_heads",),
         "mlp": ("intermediate_size", "n_inner")}
NEVER = "never"  # a variant whose mean curve never reaches the standard twin's final loss (`qkinspect twin` too)
TWIN_NUMBERS = (f"Losses are rounded to {DECIMALS} decimals and differences signed, as qkinspect twin prints them (a "
                f"difference too small for {DECIMALS} decimals keeps two significant digits); times to 3 decimals.")


def _size(config: dict[str, Any], what: str) -> Any:
    return next((config[k] for k in SIZES[what] if config.get(k) is not None), None)


def _standard_params(twin: TwinResult) -> int | None:
    return next((s.params for s in twin.summaries if s.variant == "standard"), None) or \
        next((r.params for r in twin.runs if r.variant == "standard"), None)


def scale_words(twin: TwinResult) -> str:
    """"llama, 2 layers × width 64, 4 heads (d_head 16), context 64; 12,345 parameters (standard twin)"."""
    model = twin.setup.get("model", {})
    cfg = model.get("config", {}) or {}
    layers, kv = _size(cfg, "layers"), _size(cfg, "kv_heads")
    width, heads, d_head = model_dims(twin)
    context = twin.setup.get("training", {}).get("context")
    params = _standard_params(twin)
    kv_words = f", {kv} key/value heads" if kv not in (None, heads) else ""
    return (f"{model.get('arch', 'n/a')}, {layers} layers × width {width}, {heads} heads (d_head {d_head}"
            f"{kv_words}), context {context}; "
            + (f"{params:,} parameters (standard twin)" if params else "parameters n/a"))


def setup_pairs(twin: TwinResult) -> list[tuple[str, str]]:
    """The setup as (name, words): scale, text, how it is held out, tokenizer, training, evaluation, seeds and rates."""
    s = twin.setup
    text, tok, train, ev = s.get("text", {}), s.get("tokenizer", {}), s.get("training", {}), s.get("evaluation", {})
    plan = s.get("plan", {})
    n_seeds = plan.get("seeds", 1)
    demo = " (demo: no text was given)" if text.get("demo") else ""
    files = text.get("files") or []
    rates = "; ".join(f"{v} {lr:g}" for v, (lr, _) in chosen(twin).items())
    tried = plan.get("lrs") or []
    steps = train.get("steps")
    tokens = steps * train.get("batch", 0) * train.get("context", 0) if isinstance(steps, int) else None
    return [
        ("scale", scale_words(twin)),
        ("text", f"{text.get('name', 'n/a')}{demo}: {text.get('chars', 0):,} characters in {len(files)} "
                 f"file{'s' if len(files) != 1 else ''}; {text.get('train_tokens', 0):,} training tokens, "
                 f"{text.get('held_out_tokens', 0):,} held-out tokens"),
        ("text sha256", str(text.get("sha256", "n/a"))),
        ("held out", str(text.get("held_out", "n/a"))),
        ("tokenizer", f"{tok.get('kind', 'n/a')}, vocabulary {tok.get('vocab_size', 'n/a')}, sha256 "
                      f"{str(tok.get('sha256', 'n/a'))[:16]}…"),
        ("training", f"{steps} steps (warm-up {train.get('warmup')}), batch {train.get('batch')} × context "
                     f"{train.get('context')}" + (f" = {tokens:,} tokens seen per run" if tokens else "")
                     + f"; {train.get('optimizer', 'n/a')}; {train.get('device', 'cpu')}"),
        ("start", {"draw": "draw: each constrained twin starts from the standard draw put in its form (share_qk: "
                           "W_K := W_Q)", "nearest": "nearest: each constrained twin starts from the nearest "
                           "constrained form to the standard draw"}.get(train.get("init"), "n/a")
                  + " (rank:K from its truncation, bilinear from W_Q W_Kᵀ either way)"),
        ("evaluation", f"{ev.get('windows', 'n/a')} windows ({ev.get('tokens', 0):,} tokens), "
                       + (f"every {ev['every']} steps" if ev.get("every") else "at the end only")
                       + f": {ev.get('what', '')}"),
        ("seeds", f"{n_seeds} ({'seed 0' if n_seeds == 1 else f'0 … {n_seeds - 1}'}); a seed fixes the initial "
                  "weights and the batch order of every variant"),
        ("learning rate", rates + (f" (each variant's best on seed 0 of {', '.join(f'{x:g}' for x in tried)})"
                                   if len(tried) > 1 else "")),
        ("margin", f"{margin(twin):g} nats (the two one-sided tests)" if margin(twin) is not None else "n/a"),
        ("runs", f"{len(twin.runs)} finished, {len(twin.failures)} failed, of {planned_runs(twin)} planned"
                 + (" (the folder is still being filled, or was stopped)"
                    if len(twin.runs) + len(twin.failures) < planned_runs(twin) else "")),
    ]


def planned_runs(twin: TwinResult) -> int:
    """How many runs the plan asks for: every variant at every rate on seed 0, then the other seeds at one rate."""
    plan = twin.setup.get("plan", {})
    variants, seeds, lrs = len(plan.get("variants", [])), plan.get("seeds", 0), len(plan.get("lrs", [])) or 1
    return variants * (lrs + seeds - 1) if seeds else 0


def scale_caveat(twin: TwinResult) -> str:
    train = twin.setup.get("training", {})
    params = _standard_params(twin)
    return (f"The answer holds at this scale: a model of {params:,} parameters trained {train.get('steps')} steps "
            f"on this text with this tokenizer. It says nothing yet about larger models, longer training or "
            "other text." if params else "The answer holds at this scale only.")


def summary_table(twin: TwinResult) -> Table:
    """One row per variant: free parameters, final held-out loss mean ± s.d., the paired difference from standard
    with its 90 % t-interval (the two one-sided tests'), the verdict and the first step at the standard twin's final
    loss."""
    rows = []
    for s in twin.summaries:
        ref = s.variant == "standard"
        steps = "—" if ref else str(s.steps_to_standard) if s.steps_to_standard is not None else NEVER
        rows.append([s.variant, f"{s.params:,}", plain(s.val_loss, missing="n/a"),
                     plain(seed_sd(s.val_losses), missing="n/a"),
                     *(["—"] * 3 if ref else signed_alike(s.diff, s.ci_low, s.ci_high, missing="n/a")),
                     s.verdict, steps])
    return Table("Summary: final held-out loss (nats per token), mean over seeds ± s.d.; diff with its 90 % "
                 "t-interval (the two one-sided tests at 5 %; verdicts Holm-corrected where several variants were "
                 "tested)", ["variant", "params", "val_loss", "± s.d.", "diff", "ci_low", "ci_high", "verdict",
                                "steps_to_standard"], rows)


def verdict_words(twin: TwinResult) -> list[str]:
    """Each constrained variant's answer in one sentence."""
    m = margin(twin)
    out = []
    for s in twin.summaries:
        if s.variant == "standard":
            continue
        diff, low, high = signed_alike(s.diff, s.ci_low, s.ci_high, missing="n/a")
        interval = f"; 90 % t-interval of variant − standard [{low}, {high}]" \
            if s.ci_low is not None else "; no interval: fewer than two paired seeds"
        reach = (f"; its mean curve reaches the standard twin's final loss at step {s.steps_to_standard}"
                 if s.steps_to_standard is not None else "; its mean curve never reaches the standard twin's final "
                 "loss")
        side = "above" if s.diff is not None and s.diff > 0 else "below"
        size = diff.removeprefix("+").removeprefix("-")
        out.append(f"{s.variant}: final held-out loss {size} nats "
                   f"{side} the standard twin's (mean over {s.seeds} paired seeds{interval}): {s.verdict}"
                   + (f" at a margin of {m:g} nats" if m is not None else "") + f"{reach}.")
    return out


def lr_table(twin: TwinResult) -> Table | None:
    """The learning-rate sweep: seed 0's final held-out loss per variant and rate, the chosen one marked."""
    if not twin.lr_sweep:
        return None
    lrs = sorted({t.lr for t in twin.lr_sweep})
    by = {(t.variant, t.lr): t for t in twin.lr_sweep}
    rows = []
    for v in dict.fromkeys(t.variant for t in twin.lr_sweep):
        cells = [(plain(by[v, x].val_loss, missing="n/a") + (" *" if by[v, x].chosen else "  ")) if (v, x) in by
                 else "n/a"
                 for x in lrs]
        rows.append([v, *cells])
    return Table("Learning-rate sweep: seed 0's final held-out loss (* chosen)", ["variant",
                 *(f"lr {x:g}" for x in lrs)], rows)


def runs_table(twin: TwinResult) -> Table:
    rows = [[r.variant, str(r.seed), f"{r.lr:g}", plain(r.val_loss, missing="n/a"),
             plain(r.train_loss, missing="n/a"), f"{r.seconds:.0f}",
             fmt(r.step_seconds), f"{r.violation:.1e}"]
            for r in sorted(twin.runs, key=lambda r: (list(chosen(twin)).index(r.variant)
                                                      if r.variant in chosen(twin) else 99, r.lr, r.seed))]
    return Table("Runs", ["variant", "seed", "lr", "held-out loss", "train loss", "seconds", "s per step",
                          "violation"], rows)


def failures_table(twin: TwinResult) -> Table | None:
    """The failed runs and their errors (the HTML page's table; the PDF lists them as lines)."""
    if not twin.failures:
        return None
    return Table("Failed runs", ["variant", "seed", "lr", "error"],
                 [[f.variant, str(f.seed), f"{f.lr:g}", f.error] for f in twin.failures])


def figure_plan(twin: TwinResult, name: str) -> list[tuple[Any, str]]:
    """(draw(canvas), caption) for each figure the report shows, in order."""
    plan = [(lambda canvas: learning_figure(twin, name=name, canvas=canvas), learning_caption(twin))]
    if any(s.variant != "standard" for s in twin.summaries) and any(s.variant == "standard" for s in twin.summaries):
        plan.append((lambda canvas: gap_figure(twin, name=name, canvas=canvas), gap_caption(twin)))
    for metric in tracked_metrics(twin):
        plan.append((lambda canvas, m=metric: trajectory_figure(twin, m, name=name, canvas=canvas),
                     trajectory_caption(twin, metric)))
    return plan


def write_twin_pdf(twin: TwinResult, target: str | Path | IO[bytes], *, date: dt.datetime | None = None,
                   title: str | None = None) -> int:
    """Write the report of a twin folder (qkinspect.twin.saved.read_twin) as a PDF; returns the number of pages.
    `title` names the twins in the title, footer and figures (default: the folder's name).

    Example:
        >>> write_twin_pdf(read_twin("twin-out"), "twin.pdf")  # doctest: +SKIP
        6
    """
    from qkinspect.report.pages import figure_page, report_pdf
    from qkinspect.version import __version__

    name = title or twin_name(twin)
    date = date or dt.datetime.now(dt.timezone.utc)
    with report_pdf(target, version=__version__, report="twin report", name=name, date=date, intro=TWIN_INTRO,
                    subject="transformers trained from scratch as standard and under query/key constraints") as pages:
        _first_page(pages, twin, __version__, date)
        for draw, caption in figure_plan(twin, name):
            figure_page(pages, draw, caption)
    return pages.count


TWIN_INTRO = ("The same small transformer trained from scratch from the same seeds on the same text, with W_Q and "
              "W_K as usual (standard) and under each constraint; each variant's held-out loss compared with the "
              "standard twin's, paired by seed.")


def _first_page(pages, twin: TwinResult, version: str, date: dt.datetime) -> None:
    """The first page's setup, verdicts and tables, under the title report_pdf sets."""
    pages.pairs(setup_pairs(twin) + [("folder", str(twin.folder)), ("tool", f"qkinspect {version}"),
                                     ("date", date.strftime("%Y-%m-%d %H:%M %Z").strip())], size=9, key_width=1.3)
    pages.paragraph(scale_caveat(twin), color="#a00000")
    pages.heading("Summary", size=13)
    for line in verdict_words(twin):
        pages.paragraph(line)
    pages.table(summary_table(twin), min_column=0.6, keep=True)
    pages.paragraph(f"diff: variant − standard, mean over seeds; positive is worse. steps_to_standard: the first "
                    "evaluated step at which the variant's mean held-out loss is at or below the standard twin's "
                    f"final one; {NEVER}: it does not. {TWIN_NUMBERS}", size=8)
    if (lr := lr_table(twin)) is not None:
        pages.table(lr, keep=True)
    if twin.failures:  # as lines, not a table: an error's text is longer than a column
        pages.heading("Failed runs", size=10)
        for f in twin.failures:
            pages.paragraph(f"{f.variant} seed {f.seed} lr {f.lr:g}: {f.error}", size=8, color="#a00000")
    for note in twin.notes:
        pages.paragraph(f"note: {note}", size=8, color="#a00000")
    pages.table(runs_table(twin), keep=True)
    pages.paragraph("violation: the largest departure from the constraint at the evaluated steps (0 for standard); "
                    "s per step: the median seconds per optimizer step.", size=8)
