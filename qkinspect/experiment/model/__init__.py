"""The model runtime, middle layer of the experiment: the transformers model staged from a checked folder
(`runtime`, `guard`) or given in memory (`in_memory`), the edited layers written into its modules (`writeback`) and
scored on text windows (`scoring`). The only place where model code runs."""
