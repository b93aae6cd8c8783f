"""Edits whose effect on a tiny random model's loss is measurable on every machine.

The tiny models' attention is nearly uniform (weights drawn at 0.02), so an edit of W_Q/W_K alone moves their mean
loss by float32's resolution at most (about 5e-7 at a loss of 5; exactly 0.0 on some machines). A test that needs
the edit to be in effect (so that "equal" cannot pass with the edit missing) pairs it with an ablated head and looks
at the per-token losses, which move by 4e-4 or more in every family (measured: roberta 4.0e-4, bert 6.5e-4, the
causal families 2e-2 .. 2e-1)."""

from __future__ import annotations

from qkinspect.experiment import apply_edit, parse_edit

EFFECT = 1e-4  # the per-token loss change an edit in effect shows; float32's resolution at a loss of 5 is ~5e-7


def with_ablated_neighbour(layer, edit: str, head: int):
    """`layer` with `edit` applied to `head` and the next head ablated: the first edit's write-back path (K/V
    expanded for grouped queries, q/k norms ...) and an effect on the loss that rounding cannot hide."""
    edited = apply_edit(layer, parse_edit(edit), [head]).layer
    return apply_edit(edited, parse_edit("ablate"), [(head + 1) % layer.spec.n_heads]).layer


def moved(scorer) -> float:
    """The largest change of one token's loss between the scorer's last pass and its baseline."""
    return float((scorer.token_losses - scorer.base_tokens).abs().max())
