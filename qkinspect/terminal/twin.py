"""The table `qkinspect twin` prints, for the terminal and for a notebook: a row per variant (its summary over the
seeds against the standard twin), then the learning-rate sweep, the failures and the notes."""

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

    from qkinspect.terminal.tables import COLUMN_GAP, Column, fit_tables, fmt_spec

    if not summary:
        console.print(Text("no run finished", style="bold"))
    cells = {
        "variant": [r["variant"] for r in summary],
        "params": [f"{r['params']:,}" for r in summary],
        "lr": [fmt_spec(r["lr"], "g") for r in summary],
        "seeds": [fmt_spec(r["seeds"], "d") for r in summary],
        "loss": [fmt_spec(r["val_loss"]) for r in summary],
        "diff": [fmt_spec(r["diff"], "+.4f") for r in summary],
        "95% CI": ["-" if r["ci_low"] is None else f"{r['ci_low']:+.4f} … {r['ci_high']:+.4f}" for r in summary],
        "verdict": [r["verdict"] for r in summary],
        "reach": [fmt_spec(r["steps_to_standard"], "d") for r in summary],
    }
    if len({r["seeds"] for r in summary}) == 1:  # the same for every variant: said once, above the table
        console.print(Text(f"{plural(summary[0]['seeds'], 'seed')}; loss: held-out mean; diff: paired by seed "
                           "against standard; reach: first step at standard's final loss", style="dim"))
        del cells["seeds"]
    labels = [Column("variant", cells.pop("variant"), left=True)]
    # fit_tables counts a gap after the last column, which a table does not print: a table exactly as wide as the
    # terminal (or one column narrower) fits whole
    for t in fit_tables(labels, [Column(k, v, left=k == "verdict") for k, v in cells.items()],
                        width=console.width + COLUMN_GAP):
        console.print(t)
    if sweep:  # wrapped at the console's width
        console.print(Text("learning rates (seed 0's final held-out loss; * chosen): ", style="bold") + Text(
            "; ".join(f"{r['variant']} {r['lr']:g}{'*' if r['chosen'] else ''} {fmt_spec(r['val_loss'])}"
                      for r in sweep)))
    for f in failures:
        console.print(Text(f"failed: {f['variant']} seed {f['seed']} lr {f['lr']:g}: {f['error']}", style="red"))
    for n in notes:
        console.print(Text(f"* {n}", style="dim"))
