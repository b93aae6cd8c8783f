"""The table `qkinspect twin` prints, for the terminal and for a notebook: a row per variant (its summary over the
seeds against the standard twin), how each gap was still moving at the end, the losses in bits per byte, then the
learning-rate sweep, the failures and the notes."""

from __future__ import annotations

from typing import Any


def plural(n: int, word: str) -> str:
    """`1 seed`, `2 seeds`."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def verdict_line(summary: list[dict[str, Any]]) -> str | None:
    """One line of every variant's verdict against the standard twin and its mean paired difference, for stderr
    where the table is not shown (`-o FILE`, JSON or CSV on stdout); None where no variant has one."""
    rows = [r for r in summary if r["variant"] != "standard"]
    if not rows:
        return None
    seeds = {r["seeds"] for r in summary}
    said = "; ".join(f"{r['variant']} {r['verdict']}" + ("" if r["diff"] is None else f" ({r['diff']:+.4f})")
                     for r in rows)
    over = plural(seeds.pop(), "seed") if len(seeds) == 1 else "paired seeds"
    return f"against standard (held-out loss, {over}): {said}"


def render_twin(console, summary: list[dict[str, Any]], sweep: list[dict[str, Any]], notes: list[str],
                failures: list[dict[str, Any]]) -> None:
    from rich.text import Text

    from qkinspect.numbers import signed_alike
    from qkinspect.terminal.tables import Column, fit_tables, fmt_spec

    if not summary:
        console.print(Text("no run finished", style="bold"))
    cells = {
        "variant": [r["variant"] for r in summary],
        "params": [f"{r['params']:,}" for r in summary],
        "lr": [fmt_spec(r["lr"], "g") for r in summary],
        "seeds": [fmt_spec(r["seeds"], "d") for r in summary],
        "loss": [fmt_spec(r["val_loss"]) for r in summary],
        # signed, 4 decimals or two significant digits, no negative zero: as the report and the figures print it
        "diff": [signed_alike(r["diff"], r["ci_low"], r["ci_high"])[0] for r in summary],
        "90% CI": ["-" if r["ci_low"] is None else " … ".join(signed_alike(r["diff"], r["ci_low"], r["ci_high"])[1:])
                   for r in summary],
        "verdict": [r["verdict"] for r in summary],
        # "never": the variant's mean curve does not reach standard's final loss (the report's word too)
        "reach": ["-" if r["variant"] == "standard" else "never" if r["steps_to_standard"] is None
                  else fmt_spec(r["steps_to_standard"], "d") for r in summary],
    }
    tested = sum(r["p_one_sided_better"] is not None for r in summary)
    said = ("loss: held-out mean (nats per token); diff: paired by seed against standard; 90% CI: the interval of "
            "the two one-sided tests at 5 % against the margin")
    said += (f"; verdicts Holm-corrected over the {tested} variants tested" if tested > 1 else "")
    said += "; reach: first step at standard's final loss"
    if len({r["seeds"] for r in summary}) == 1:  # the same for every variant: said once, above the table
        said = f"{plural(summary[0]['seeds'], 'seed')}; {said}"
        del cells["seeds"]
    if summary:
        console.print(Text(said, style="dim"))
    labels = [Column("variant", cells.pop("variant"), left=True)]
    for t in fit_tables(labels, [Column(k, v, left=k == "verdict") for k, v in cells.items()],
                        width=console.width):
        console.print(t)
    _render_moving_and_bits(console, summary)
    if sweep:  # wrapped at the console's width
        console.print(Text("learning rates (seed 0's final held-out loss; * chosen): ", style="bold") + Text(
            "; ".join(f"{r['variant']} {r['lr']:g}{'*' if r['chosen'] else ''} {fmt_spec(r['val_loss'])}"
                      for r in sweep)))
    for f in failures:
        console.print(Text(f"failed: {f['variant']} seed {f['seed']} lr {f['lr']:g}: {f['error']}", style="red"))
    for n in notes:
        console.print(Text(f"* {n}", style="dim"))


def render_ladder(console, ladder) -> None:
    """A ladder's table: a row per shape and constrained variant (the shape's size, tokens, the paired gap and its
    interval, the verdict), then one line per variant with its scaling fit (or why there is none), then the notes."""
    from rich.text import Text

    from qkinspect.terminal.tables import Column, fit_tables, fmt_spec

    rows = [s for s in ladder.summaries if s.summary.variant != "standard"]
    if not rows:
        console.print(Text("no constrained run finished at any shape", style="bold"))
    else:
        console.print(Text("N: the standard twin's non-embedding parameters; tokens: each run's; diff: variant − "
                           "standard held-out loss, paired by seed", style="dim"), soft_wrap=True)
        starts = [i for i in range(1, len(rows)) if rows[i].shape != rows[i - 1].shape]
        cells = {
            "N": [f"{s.non_embedding_params:,}" for s in rows],
            "tokens": [_short(s.tokens) for s in rows],
            "variant": [s.summary.variant for s in rows],
            "seeds": [fmt_spec(s.summary.seeds, "d") for s in rows],
            "diff": [fmt_spec(s.summary.diff, "+.4f") for s in rows],
            f"{ladder.level:.0%} CI": ["-" if s.summary.ci_low is None else
                                f"{s.summary.ci_low:+.3f} … {s.summary.ci_high:+.3f}"
                   for s in rows],
            "verdict": [s.summary.verdict for s in rows],
        }
        labels = [Column("shape", [s.shape for s in rows], left=True)]
        for t in fit_tables(labels, [Column(k, v, left=k in ("variant", "verdict")) for k, v in cells.items()],
                            width=console.width, sections=starts):
            console.print(t)
    for f in ladder.fits:
        ci = "" if f.alpha_low is None else f" [{f.alpha_low:.2f}, {f.alpha_high:.2f}] ({f.level:.0%} bootstrap)"
        if f.alpha is None:
            line = Text(f"{f.variant}: no power law: {f.reason}", style="yellow")
        elif f.describes is False:
            line = Text(f"{f.variant}: no power law: it does not describe the shapes (α would be {f.alpha:.2f}"
                        f"{ci}; residual {f.residual:.2f}, lack of fit p = {f.p_fit:.3f})", style="yellow")
        else:
            fit = "" if f.residual is None else f", residual {f.residual:.2f}"
            if f.p_fit is not None:
                fit += f", lack of fit p = {f.p_fit:.3f}"
            line = Text(f"{f.variant}: gap ≈ {f.a:.3g} · N^−α, α = {f.alpha:.2f}{ci} over {f.rungs} shapes{fit}")
        console.print(line, soft_wrap=True)
    for n in ladder.notes:
        console.print(Text(f"* {n}", style="dim"), soft_wrap=True)


def _short(n: int) -> str:
    """A token count in three figures: 786k, 1.2M."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


def _render_moving_and_bits(console, summary: list[dict[str, Any]]) -> None:
    """A second table: each variant's held-out loss in bits per byte (and its diff), and how its gap was still
    moving at the end (slope per 1000 steps with its 90 % interval); only the columns that have values."""
    from rich.text import Text

    from qkinspect.numbers import signed_alike
    from qkinspect.terminal.tables import Column, fit_tables, fmt_spec

    moving = any(r.get("slope") is not None for r in summary)
    bits = any(r.get("val_bpb") is not None for r in summary)
    if not summary or not (moving or bits):
        return
    cells: dict[str, list[str]] = {}
    said = []
    if bits:
        cells["bpb"] = [fmt_spec(r["val_bpb"]) for r in summary]
        cells["diff bpb"] = ["-" if r["variant"] == "standard" else signed_alike(r["diff_bpb"])[0] for r in summary]
        said.append("bpb: held-out loss in bits per byte of the held-out text")
    if moving:
        starts = sorted({r["slope_from"] for r in summary if r.get("slope_from") is not None})
        slopes = [signed_alike(r.get("slope"), r.get("slope_low"), r.get("slope_high")) for r in summary]
        cells["slope/1k"] = [x[0] for x in slopes]
        cells["slope 90% CI"] = ["-" if r.get("slope_low") is None else f"{x[1]} … {x[2]}"
                                 for r, x in zip(summary, slopes, strict=True)]
        window = f"from step {starts[0]}" if len(starts) == 1 else "over the last evaluations"
        said.append(f"slope/1k: how the gap was still moving, its change per 1000 steps {window} to the end (mean "
                    "over seeds)")
    console.print(Text("; ".join(said), style="dim"))
    labels = [Column("variant", [r["variant"] for r in summary], left=True)]
    for t in fit_tables(labels, [Column(k, v) for k, v in cells.items()], width=console.width):
        console.print(t)
