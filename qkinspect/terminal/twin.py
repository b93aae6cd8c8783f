"""The table `qkinspect twin` prints, for the terminal and for a notebook: a row per variant (its summary over the
seeds against the standard twin), then the learning-rate sweep, the failures and the notes."""

from __future__ import annotations

from typing import Any


def render_twin(console, summary: list[dict[str, Any]], sweep: list[dict[str, Any]], notes: list[str],
                failures: list[dict[str, Any]]) -> None:
    from rich.text import Text

    from qkinspect.terminal.tables import Column, fit_tables, fmt_spec

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
        console.print(Text(f"{summary[0]['seeds']} seeds; loss: held-out mean; diff: paired by seed "
                           "against standard; reach: first step at standard's final loss", style="dim"),
                      soft_wrap=True)
        del cells["seeds"]
    labels = [Column("variant", cells.pop("variant"), left=True)]
    for t in fit_tables(labels, [Column(k, v, left=k == "verdict") for k, v in cells.items()],
                        width=console.width):
        console.print(t)
    if sweep:
        console.print(Text("learning rates (seed 0's final held-out loss; * chosen): ", style="bold") + Text(
            "; ".join(f"{r['variant']} {r['lr']:g}{'*' if r['chosen'] else ''} {fmt_spec(r['val_loss'])}"
                      for r in sweep)), soft_wrap=True)
    for f in failures:
        console.print(Text(f"failed: {f['variant']} seed {f['seed']} lr {f['lr']:g}: {f['error']}", style="red"),
                      soft_wrap=True)
    for n in notes:
        console.print(Text(f"* {n}", style="dim"), soft_wrap=True)
