"""The edits, bottom layer of the experiment: their names (`names`), the pure edits of an `AttentionLayer`
(`apply`), their closed forms (`forms`), the rotary gauge they keep (`rotary`), their definitions through q/k
norms (`qknorm`) and their parametrisations for healing (`parametrised`). Tensors in, tensors out: no model
runs here."""
