"""The healed runs of `qkinspect experiment --heal` as a table: healed loss, the control's, their difference ±
its standard error, the cost before healing and the share recovered (shown only above the noise)."""

from __future__ import annotations


def _recovered(r) -> str:
    """The share recovered, shown only where the unhealed cost stands above the noise of a difference on these
    windows (twice the healed difference's standard error); the JSON keeps every value."""
    if r.recovered is None or r.unhealed is None or r.se is None or r.unhealed <= 2 * r.se:
        return "-"
    return f"{100 * r.recovered:.0f}%"


LATE_WORDS = (", last ¼=how far −control moved over the run's last quarter (from the last step scored at or before "
              "¾ of the steps to the end) ± its paired standard error: near 0 the curve has flattened, negative it "
              "was still falling")


def _late(change) -> str:
    """A late change as `+0.0012±0.0040` (`-` where there is none)."""
    if change is None:
        return "-"
    se = "" if change.se is None else f"±{change.se:.4f}"
    return f"{change.change:+.4f}{se}"


def render_healing(console, healing) -> None:
    """The healed runs as a table: healed loss, the control's, their difference ± its standard error, the cost
    before healing and the share recovered."""
    from qkinspect.terminal.tables import Column, fit_tables, fmt_spec

    if healing is None:
        return
    h = healing
    dtype = "" if h.precision is None else f", {h.precision.dtype} on {h.device}"
    console.print(f"healing: {h.steps} steps of {h.batch_windows} windows{dtype}, lr {h.lr:g}, trained {h.trained} "
                  f"({h.trained_parameters:,} of {h.parameters:,} parameters), on {h.text} ({h.train_tokens} tokens,"
                  f" {h.epochs:.2f} passes); control after healing {h.control_loss:.4f} "
                  f"({h.control_gain:+.4f} from the baseline)", highlight=False)
    runs = h.runs
    labels = [Column("edit", [r.edit for r in runs], left=True),
              Column("layer", [fmt_spec(r.layer, "d") for r in runs])]
    if any(r.head is not None for r in runs):
        labels.append(Column("head", [fmt_spec(r.head, "d") for r in runs]))
    values = [Column("healed", [fmt_spec(r.loss, ".4f") for r in runs]),
              Column("−control", [fmt_spec(r.diff, "+.4f") for r in runs]),
              Column("±se", [fmt_spec(r.se, ".4f") for r in runs]),
              Column("unhealed Δ", [fmt_spec(r.unhealed, "+.4f") for r in runs]),
              Column("recovered", [_recovered(r) for r in runs])]
    if any(r.late is not None for r in runs):
        values.append(Column("last ¼", [_late(r.late) for r in runs]))
    for t in fit_tables(labels, values, width=console.width):
        console.print(t)
    console.print("columns: healed=loss after healing, −control=healed loss − healed control loss (the edit's cost "
                  "after healing) ± its standard error, unhealed Δ=the edit's Δloss before healing, recovered=1 − "
                  "(−control)/(unhealed Δ), shown where the unhealed Δ exceeds 2 se"
                  + LATE_WORDS * any(r.late is not None for r in runs),
                  highlight=False)
    if h.control_late is not None:
        console.print(f"control over the last quarter (steps {h.control_late.start}→{h.control_late.end}): "
                      f"{_late(h.control_late)}", highlight=False)
    # its notes go with the experiment's (`ExperimentResult.reader_notes`): on stderr from the CLI
