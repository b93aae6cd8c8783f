"""A ladder folder's report (`qkinspect report LADDER`, docs/twin.md "Scale"), PDF or one HTML page: a first page
with the setup the shapes share, the shapes (sizes, non-embedding parameters, steps, tokens), each variant's scaling
fit in words, the per-shape table and what the ladder can say; then the scaling figure and each shape's gap figure
with their captions. Each shape's full twin report is its own folder's (`qkinspect report LADDER/LxD`)."""

from __future__ import annotations

import datetime as dt
from html import escape
from pathlib import Path
from typing import IO, Any

from qkinspect.report.style import NUMBER_NOTE, fmt
from qkinspect.report.tables import Table
from qkinspect.twin.ladder import LadderResult


def ladder_name(ladder: LadderResult) -> str:
    return Path(ladder.folder).resolve().name or str(ladder.folder)


def shared_pairs(ladder: LadderResult) -> list[tuple[str, str]]:
    """The setup every shape shares (text, tokenizer, training but its steps, evaluation, seeds, rates, margin),
    from the first shape's twin; the scale and the runs are per shape (the shapes table)."""
    from qkinspect.report.twin.pdf import setup_pairs

    keep = ("text", "text sha256", "held out", "tokenizer", "evaluation", "seeds", "learning rate", "margin")
    pairs = [p for p in setup_pairs(ladder.twins[0]) if p[0] in keep]
    budget = (f"{ladder.tokens_per_param:g} training tokens per non-embedding parameter (each shape's steps set "
              "from it)" if ladder.tokens_per_param else "the same steps at every shape")
    train = ladder.twins[0].setup.get("training", {})
    return [("shapes", ", ".join(r.name for r in ladder.rungs)), ("budget", budget),
            ("training", f"batch {train.get('batch')} × context {train.get('context')}; "
                         f"{train.get('optimizer', 'n/a')}; {train.get('device', 'cpu')}"), *pairs]


def shapes_table(ladder: LadderResult) -> Table:
    rows = []
    for rung, twin in zip(ladder.rungs, ladder.twins, strict=True):
        s = next((x for x in ladder.summaries if x.shape == rung.name), None)
        rows.append([rung.name, str(rung.heads), f"{rung.d_model // rung.heads}", f"{rung.non_embedding_params:,}",
                     f"{s.standard_params:,}" if s else "n/a", str(rung.steps), f"{s.tokens:,}" if s else "n/a",
                     f"{len(twin.runs)}"])
    return Table("Shapes", ["shape", "heads", "d_head", "non-embedding params", "params (standard)", "steps",
                            "tokens per run", "runs"], rows)


def ladder_table(ladder: LadderResult) -> Table:
    rows = [[s.shape, s.summary.variant, f"{s.non_embedding_params:,}", fmt(s.summary.val_loss),
             *(["—"] * 3 if s.summary.variant == "standard" else
               [fmt(s.summary.diff), fmt(s.summary.ci_low), fmt(s.summary.ci_high)]), s.summary.verdict]
            for s in ladder.summaries]
    return Table("Per shape: final held-out loss (nats per token), mean over seeds; diff: variant − standard paired "
                 "by seed, with the summary's interval", ["shape", "variant", "N", "val_loss", "diff", "ci_low",
                                                          "ci_high", "verdict"], rows)


def fit_words(ladder: LadderResult) -> list[str]:
    out = []
    for f in ladder.fits:
        if f.alpha is None:
            out.append(f"{f.variant}: no power law fitted: {f.reason}.")
            continue
        ci = (f" ({f.level:.0%} bootstrap interval over seeds [{f.alpha_low:.2f}, {f.alpha_high:.2f}], "
              f"{f.dropped} of {f.draws} draws left out)" if f.alpha_low is not None else "")
        res = (f"; weighted residual {f.residual:.2f} per degree of freedom (about 1: the shapes scatter about the "
               "line as their seeds say they should)" if f.residual is not None else
               "; two shapes: the line passes through both, no residual to judge it by")
        trend = "closes" if f.alpha > 0 else "widens"
        if f.describes is False:
            out.append(f"{f.variant}: a power law does not describe these shapes: the line gap ≈ {f.a:.3g} · N^−α with "
                       f"α = {f.alpha:.2f}{ci} over {f.rungs} shapes{res}, rejected by the lack-of-fit test (p = "
                       f"{f.p_fit:.3f}, parametric bootstrap; below {1 - f.level:.2f}): read the shapes' gaps, not α.")
            continue
        if f.p_fit is not None:
            res += f"; lack-of-fit p = {f.p_fit:.3f} (parametric bootstrap: the law is not rejected)"
        out.append(f"{f.variant}: gap ≈ {f.a:.3g} · N^−α with α = {f.alpha:.2f}{ci} over {f.rungs} shapes{res}: "
                   f"in this range the cost {trend} as the model grows.")
    return out


def caveat(ladder: LadderResult) -> str:
    ns = [r.non_embedding_params for r in ladder.rungs if r.non_embedding_params]
    span = f"{min(ns):,} to {max(ns):,} non-embedding parameters" if ns else "these shapes"
    return (f"The fit describes {span} at this budget, on this text and tokenizer; extrapolating it beyond the "
            "shapes measured, or to another budget, is a guess the ladder does not support.")


def figure_plan(ladder: LadderResult, name: str) -> list[tuple[Any, str]]:
    from qkinspect.report.twin.figures import gap_caption, gap_figure
    from qkinspect.report.twin.scaling import scaling_figure

    plan = [(lambda canvas: scaling_figure(ladder, name=name, canvas=canvas),
             "Each constrained variant's final held-out loss minus the standard twin's, paired by seed, at each "
             "shape (x: the standard twin's non-embedding parameters, log scale; points of one shape are set side "
             "by side), with the per-shape summary's interval; the line is a · N^−α fitted to the per-seed gaps "
             "(weighted log-log least squares), its band the bootstrap over seeds; solid: zero, dashed: ± the margin. "
             "A variant whose gaps cross zero has no line.")]
    for rung, twin in zip(ladder.rungs, ladder.twins, strict=True):
        if any(s.variant != "standard" for s in twin.summaries) and any(s.variant == "standard"
                                                                        for s in twin.summaries):
            plan.append((lambda canvas, t=twin, r=rung: gap_figure(t, name=f"{name} {r.name}", canvas=canvas),
                         f"{rung.name}: " + gap_caption(twin)))
    return plan


def write_ladder_pdf(ladder: LadderResult, target: str | Path | IO[bytes], *, date: dt.datetime | None = None,
                     title: str | None = None) -> int:
    """Write the report of a ladder folder (qkinspect.twin.ladder.read_ladder) as a PDF; returns its pages."""
    from qkinspect.report.pages import figure_page, report_pdf
    from qkinspect.version import __version__

    name = title or ladder_name(ladder)
    date = date or dt.datetime.now(dt.timezone.utc)
    intro = ("The twin at several model sizes: at each shape the same small transformer trained from scratch from the "
             "same seeds, as standard and under each constraint; each constraint's paired gap to the standard twin, "
             "and how it moves with the model's size.")
    with report_pdf(target, version=__version__, report="twin ladder report", name=name, date=date, intro=intro,
                    subject="the constraints' cost against model size") as pages:
        pages.pairs(shared_pairs(ladder) + [("folder", str(ladder.folder)), ("tool", f"qkinspect {__version__}"),
                                            ("date", date.strftime("%Y-%m-%d %H:%M %Z").strip())],
                    size=9, key_width=1.3)
        pages.table(shapes_table(ladder))
        pages.heading("Scaling", size=13)
        for line in fit_words(ladder):
            pages.paragraph(line)
        pages.paragraph(caveat(ladder), color="#a00000")
        pages.table(ladder_table(ladder), min_column=0.6)
        pages.paragraph(f"N: the standard twin's non-embedding parameters. {NUMBER_NOTE}", size=8)
        for note in ladder.notes:
            pages.paragraph(f"note: {note}", size=8, color="#a00000")
        for draw, caption in figure_plan(ladder, name):
            figure_page(pages, draw, caption)
    return pages.count


def render_ladder_html(ladder: LadderResult, *, date: dt.datetime | None = None, name: str | None = None) -> str:
    """The ladder's report as one HTML page, as in the PDF."""
    from qkinspect.report.pages import CSS, html_table, svg
    from qkinspect.report.style import new_figure
    from qkinspect.version import __version__

    name = name or ladder_name(ladder)
    when = (date or dt.datetime.now(dt.timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    pairs = [*shared_pairs(ladder), ("folder", str(ladder.folder)), ("tool", f"qkinspect {__version__}"),
             ("date", when)]
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>qkinspect twin ladder report: "
             f"{escape(name)}</title><style>{CSS}</style></head><body>",
             f"<h1>qkinspect twin ladder report: {escape(name)}</h1>",
             html_table(Table("Setup", ["", ""], [list(p) for p in pairs])), html_table(shapes_table(ladder)),
             "<h2>Scaling</h2>", *(f"<p>{escape(line)}</p>" for line in fit_words(ladder)),
             f"<p><b>{escape(caveat(ladder))}</b></p>", html_table(ladder_table(ladder)),
             f"<p class='meta'>{escape(NUMBER_NOTE)}</p>"]
    parts += [f"<p class='meta'>note: {escape(n)}</p>" for n in ladder.notes]
    parts.append("<h2>Figures</h2>")
    for draw, caption in figure_plan(ladder, name):
        parts.append(f"<figure>{svg(draw(new_figure))}<figcaption>{escape(caption)}</figcaption></figure>")
    return "\n".join([*parts, "</body></html>"])
