"""The table `qkinspect experiment` prints, for the terminal and for a notebook (qkinspect.notebook): library
presentation, below the experiment's records, so that the records show themselves without the CLI."""

from __future__ import annotations

from typing import Any

from qkinspect.terminal.healing import render_healing


def render_experiment(console, result, rows: list[dict[str, Any]], notes: list[str]) -> None:
    """`qkinspect experiment`'s table of `result` (its `rows`, as `experiment.results.run_rows` gives them),
    then the legend, the estimate's agreement, the predictors, healing and `notes` (the CLI gives none: it prints
    them on stderr, whatever -o is), every line wrapped at the console's width."""
    from rich.text import Text

    from qkinspect.terminal.tables import Column, fit_tables, fmt_spec

    baseline = 0.0 if abs(result.baseline) < 5e-5 else result.baseline  # no "-0.0000" for a drift of ~0
    console.print(Text(result.model.name, style="bold") + Text(
        f"  {result.measure_name} on {result.text}: {result.tokens} tokens ({result.windows} × "
        f"{result.window}), baseline {baseline:.4f}"))
    cells = {"edit": [r["edit"] for r in rows], "scope": [r["scope"] for r in rows],
             "layer": [fmt_spec(r["layer"], "d") for r in rows], "head": [fmt_spec(r["head"], "d") for r in rows],
             "loss": [fmt_spec(r["loss"]) for r in rows], "Δloss": [fmt_spec(r["dloss"], "+.4f") for r in rows],
             "±": [fmt_spec(r["dloss_se"], ".4f") for r in rows],
             "Δ/Δabl": [fmt_spec(r["dloss_ratio_ablate"], ".2f") for r in rows],
             "pred": [fmt_spec(r["predicted"], ".3f") for r in rows]}
    estimated = result.estimate is not None
    if estimated:  # an estimated map: the exact loss and ratio are empty but for the few verified heads
        del cells["loss"], cells["Δ/Δabl"]
        cells["est"] = [fmt_spec(r["dloss_estimate"], "+.4f") for r in rows]
        cells["±MC"] = [fmt_spec(r["dloss_estimate_se"], ".4f") for r in rows]
        cells["flag"] = ["!" if r["unreliable"] else "" for r in rows]
    if any(r["offset0_only"] for r in rows):
        cells["off0"] = ["yes" if r["offset0_only"] else "" for r in rows]
    if all(r["head"] is None for r in rows):
        del cells["head"]
    labels = [Column(k, cells.pop(k), left=k in ("edit", "scope")) for k in ("edit", "scope", "layer", "head")
              if k in cells]
    for t in fit_tables(labels, [Column(k, v) for k, v in cells.items()], width=console.width):
        console.print(t)
    console.print("columns: ±=standard error of the exact Δloss"
                  + ("" if estimated else ", Δ/Δabl=Δloss / Δloss(ablate) of the same heads (- where ablating does "
                                          "not cost beyond 2 standard errors)")
                  + ", pred=weight-space prediction"
                  + (", est=estimated Δloss, ±MC=Monte-Carlo standard error of the estimate's curvature term alone "
                     "(not the estimate's error: the exact runs and ρ below measure that), !=unreliable estimate "
                     "(an exact run on part of the text, made where the edit moves the residual stream far, found "
                     "the cost far above it)" if estimated else "")
                  + (", off0=exact at offset 0 only (rotary)" if "off0" in cells else "")
                  + "; -=none: " + ("Δloss and ± of a head not run exactly, " if estimated else "")
                  + "layer or head of a run over several, pred of an edit without a prediction",
                  highlight=False)
    if estimated:
        e = result.estimate
        console.print(f"estimate: {e.probes} probes, {e.seconds:.1f} s for every head × edit; "
                      f"{e.verify_seconds:.1f} s for the exact runs that check it", highlight=False)
        from qkinspect.rho import rho_text

        for a in e.agreement:
            rand = f"; over the {a.sampled} drawn at random: {rho_text(a.rho_sampled, a.sampled)}" if a.sampled else ""
            console.print(f"agreement {a.edit}: Spearman's rank correlation of estimate and exact Δloss "
                          f"{rho_text(a.rho, a.verified, 'verified heads')}{rand}", highlight=False)
    for name, what in result.predictors.items():
        console.print(f"predicted for {name}: {what}", highlight=False)
    render_healing(console, getattr(result, "healing", None))
    for n in notes:
        console.print(f"note: {n}", highlight=False)
