"""The tables people read: the rich tables `qkinspect` prints in a terminal and a result shows in a notebook
(qkinspect.notebook). Library presentation, below every result type, so a result renders itself without the CLI:
- `tables`: column choice, short headers and legends, value formatting and colour, tables fitted to a width, and
  the analysis and sweep views built from them;
- `experiment`: `qkinspect experiment`'s table, its legend and the estimate's agreement;
- `healing`: the healed runs' table (`experiment --heal`).

The CLI (qkinspect.cli) only chooses which of these to print; nothing here parses an option.
"""
