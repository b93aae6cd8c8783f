"""The composition's pages: its figure and its report section (`figures`), drawn from its records."""
