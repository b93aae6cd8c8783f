"""Figures, tables and reports, by subject: `analysis` (the model's figures and report), `experiment` (the
experiment's figure, cost map and report section) and `sweep` (trajectories and the sweep report), over the shared
drawing pieces here (`style`, `heatmap` and the `grid` it draws, `titles`, `pages` and the `tables` they lay out),
which read no subject's records. Only reading and arranging: every number drawn is computed by the library."""
