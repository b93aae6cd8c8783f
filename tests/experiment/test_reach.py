"""`reach` (qkinspect.experiment.reach) against the models' own modules: the map R(x, o) by which each family's block
writes its attention output into the residual stream reproduces that residual, captured by hooks on the block and
its feed-forward branch, for every family `experiment` runs; the estimate's `reach` equals the residual change of
the single-head edit written into the model and run forward; the identities of `residual_change` (hypothesis)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkinspect.experiment.edits.apply import apply_edit
from qkinspect.experiment.edits.names import parse_edit
from qkinspect.experiment.estimate import _get, estimate_heads, sites
from qkinspect.experiment.model.scoring import Scorer, default_text, windows
from qkinspect.experiment.model.writeback import written
from qkinspect.experiment.reach import POST_NORM, SANDWICH, reach, residual_change, writer
from tests.experiment import tiny_models as tiny
from tests.experiment.test_run import opened

FAMILIES = {"llama": tiny.llama, "bert": tiny.bert, "gpt2": tiny.gpt2, "mistral": tiny.mistral,
            "roberta": tiny.roberta, "qwen2": tiny.qwen2, "mixtral": tiny.mixtral, **tiny.WRITEBACK_FAMILIES}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("reach_models")
    return {name: make(root / name) for name, make in FAMILIES.items()}


def _branch(model_type: str, block: torch.nn.Module) -> torch.nn.Module:
    """The module whose output is the block's output minus the attention's residual: the feed-forward branch as
    it is added (after its own norm in the sandwich families); for post-norm blocks, the attention's output module,
    whose output is that residual itself."""
    if model_type in POST_NORM:
        return block.attention.output
    return block.post_feedforward_layernorm if model_type in SANDWICH else block.mlp


def _residuals(hf, layer: int, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One forward pass: the block's input x, its output projection's output o, and the residual r the attention
    writes into, as the model's own modules compute it (flattened to (M, D))."""
    block = hf.layers[layer]
    model_type = hf.model.config.model_type
    got = {}

    def keep_x(m, args, kwargs):
        got["x"] = args[0] if args else kwargs["hidden_states"]

    def keep(name):
        def hook(m, args, out):
            got[name] = out[0] if isinstance(out, tuple) else out

        return hook

    hooks = [block.register_forward_pre_hook(keep_x, with_kwargs=True),
             _get(block, sites(block).output).register_forward_hook(keep("o")),
             block.register_forward_hook(keep("out")),
             _branch(model_type, block).register_forward_hook(keep("branch"))]
    inputs = {"input_ids": ids} if hf.kind == "causal" else {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    try:
        with torch.no_grad():
            hf.model(**inputs)
    finally:
        for h in hooks:
            h.remove()
    D = got["x"].shape[-1]
    r = got["branch"] if model_type in POST_NORM else got["out"] - got["branch"]
    return got["x"].reshape(-1, D), got["o"].reshape(-1, D), r.reshape(-1, D)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_writer_reproduces_the_blocks_residual(models, family):
    hf, layers = opened(models[family])
    ids = windows(hf, default_text(), 48, 48)
    for layer in (0, 1):
        x, o, r = _residuals(hf, layer, ids)
        with torch.no_grad():
            mine = writer(hf.model.config.model_type, hf.layers[layer])(x, o)
        # float32 sums of O(|r|) terms, taken in another order (the block adds its branches in its own order)
        assert float((mine - r).norm() / r.norm()) < 1e-5, (family, layer)


@pytest.mark.parametrize(("family", "edit"), [("llama", "share_qk"), ("gemma3", "share_qk"), ("olmo2", "ablate"),
                                             ("bert", "share_qk"), ("gpt2", "rank:2")])
def test_estimated_reach_is_the_single_head_edits_residual_change(models, family, edit):
    """The estimate's reach (every head edited at once, one rerun of the attention module) against each head's
    edit written into the model alone and the whole model run: the residual its block writes, before and after."""
    hf, layers = opened(models[family])
    ids = windows(hf, default_text(), 96, 32)
    s = Scorer(hf, ids, batch_tokens=64)
    s.baseline(cache={1})
    edit = parse_edit(edit)
    H = layers[1].spec.n_heads
    found = estimate_heads(s, {1: layers[1]}, list(range(H)), [edit], probes=2)
    for x in found:
        ratios = []
        for b in s.batches:
            _, _, r = _residuals(hf, 1, b)
            with written(hf, [apply_edit(layers[1], edit, [x.head]).layer]):
                _, _, r1 = _residuals(hf, 1, b)
            ratios.append((r1 - r).double().pow(2).sum(-1) / r.double().pow(2).sum(-1))
        ref = float(torch.cat(ratios).mean().sqrt())
        # float32 differences of residuals: relative rounding ~1e-7 of |r|, against a change of reach · |r|
        assert x.reach == pytest.approx(ref, rel=1e-3, abs=1e-5), (family, x.head)


finite = st.floats(0.1, 10, allow_nan=False, allow_infinity=False)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), finite)
def test_residual_change_identities(seed, c):
    g = torch.Generator().manual_seed(seed)
    M, H, D = 6, 3, 8
    x, o = (torch.randn(M, D, generator=g, dtype=torch.float64) for _ in range(2))
    delta = torch.randn(M, H, D, generator=g, dtype=torch.float64)

    def pre(a, b):
        return a + b

    # nothing changed: 0; a pre-norm block: |Δo_h|² / |x + o|² exactly
    assert torch.equal(residual_change(pre, x, o, torch.zeros_like(delta)), torch.zeros(M, H, dtype=torch.float64))
    dense = delta.pow(2).sum(-1) / (x + o).pow(2).sum(-1)[:, None]
    assert torch.allclose(residual_change(pre, x, o, delta), dense, rtol=1e-12)
    # a pre-norm residual is moved in proportion: scaling x, o and Δo together changes nothing
    assert torch.allclose(residual_change(pre, c * x, c * o, c * delta), dense, rtol=1e-9)
    # a sandwich norm sees o's direction only: scaling o and Δo together changes nothing, whatever x is
    norm = torch.nn.RMSNorm(D, eps=0.0, dtype=torch.float64)

    def sandwich(a, b):
        return a + norm(b)

    assert torch.allclose(residual_change(sandwich, x, c * o, c * delta), residual_change(sandwich, x, o, delta),
                          rtol=1e-9)
    # reach is the root mean square over tokens
    ratio = residual_change(pre, x, o, delta)
    assert torch.allclose(reach(ratio.sum(0), M), ratio.sqrt().pow(2).mean(0).sqrt(), rtol=1e-12)
