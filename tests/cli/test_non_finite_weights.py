"""Issue 39: NaN or inf in any tensor that composition or directions read never crashes. Attention weights and folded
norms: the affected heads are NaN (composition) or left out (directions) with a warning naming them, every other
head as in the clean model; the embedding, unembedding or final norm directions read through: one error line
naming the tensor (exit 2)."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest

import qkinspect
from tests.one_line import one_error_line

LAYER = "model.layers.1"
ATTENTION = [f"{LAYER}.self_attn.{p}_proj.{w}" for p in "qkvo" for w in ("weight", "bias")]
NORM = f"{LAYER}.input_layernorm.weight"
VOCAB = ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"]
HEAD_OF_ROW0 = 0  # entry [0, 0] of a q/k/v projection is output row 0: head 0 (kv head 0 serves heads 0 and 1)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=16, tie_word_embeddings=False,
                      attention_bias=True)
    path = tmp_path_factory.mktemp("llama_lm")
    LlamaForCausalLM(cfg).eval().save_pretrained(path, safe_serialization=True)
    return path


def _poisoned(clean, tmp_path, name: str, value: float):
    from safetensors.torch import load_file, save_file

    out = tmp_path / "poisoned"
    shutil.copytree(clean, out)
    tensors = load_file(clean / "model.safetensors")
    t = tensors[name].clone()
    t.view(-1)[0] = value
    tensors[name] = t
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


def _affected(name: str) -> set[int]:
    """The layer-1 query heads whose composition or directions a poisoned entry [0, 0] reaches."""
    if "bias" in name:
        return set()  # neither reads biases
    if name == NORM:
        return {0, 1, 2, 3}  # folded into every head's factors
    if "v_proj" in name or "k_proj" in name:
        return {0, 1}  # kv head 0 serves query heads 0 and 1
    return {0}  # W_Q's row 0, or W_O's column 0 (nn.Linear's [out, in]: head 0's input)


@pytest.mark.parametrize("value", [math.nan, math.inf])
@pytest.mark.parametrize("name", [*ATTENTION, NORM])
def test_composition_names_the_non_finite_heads(clean, tmp_path, name, value):
    fold = name == NORM
    want = qkinspect.composition(clean, fold_ln=fold)
    got = qkinspect.composition(_poisoned(clean, tmp_path, name, value), fold_ln=fold)
    nan_later: set[int] = set()
    for key, arr in got.scores.items():
        ref = want.scores[key]
        bad = ~np.isfinite(arr)
        np.testing.assert_allclose(arr[~bad], ref[~bad], rtol=1e-6)  # every other pair as in the clean model
        if bad.any():
            assert key[3] == 1, key  # only pairs into layer 1 (layer 0 writes nothing poisoned)
            nan_later |= set(np.nonzero(bad.all(axis=0))[0].tolist())
    assert nan_later == _affected(name), (name, nan_later)
    assert bool(nan_later) == bool(got.warnings)
    for h in nan_later:
        assert any(f"later head{'s' if len(nan_later) > 1 else ''} " in w and str(h) in w for w in got.warnings)


@pytest.mark.parametrize("value", [math.nan, math.inf])
@pytest.mark.parametrize("name", [*ATTENTION, NORM])
@pytest.mark.parametrize("heads", [None, 0])
def test_directions_leave_out_and_name_the_non_finite_heads(clean, tmp_path, name, value, heads):
    fold = name == NORM
    want = qkinspect.directions(clean, heads=heads, fold_ln=fold)
    got = qkinspect.directions(_poisoned(clean, tmp_path, name, value), heads=heads, fold_ln=fold)
    gone = {(r.layer, r.head, r.matrix) for r in want.records} - {(r.layer, r.head, r.matrix) for r in got.records}
    kept = [r for r in want.records if (r.layer, r.head, r.matrix) not in gone]
    assert [(r.head, r.matrix, r.side, r.sign, r.token_ids) for r in got.records] == \
        [(r.head, r.matrix, r.side, r.sign, r.token_ids) for r in kept]
    matrix = "ov" if ("v_proj" in name or "o_proj" in name) else "qk"
    wanted = {h for h in _affected(name) if heads is None or h == heads}
    if name == NORM:
        assert gone == {(1, h, m) for h in wanted for m in ("ov", "qk")}
    else:
        assert gone == {(1, h, matrix) for h in wanted}
    assert all(layer == 1 for layer, _, _ in gone)
    for _, h, m in gone:
        assert any("layer 1 head" in w and str(h) in w and f"{m.upper()} directions" in w for w in got.warnings)
    assert bool(gone) == bool(got.warnings)


@pytest.mark.parametrize("name", VOCAB)
@pytest.mark.parametrize("value", [math.nan, -math.inf])
def test_directions_refuse_a_non_finite_token_matrix(cli, clean, tmp_path, name, value):
    one_error_line(cli("directions", _poisoned(clean, tmp_path, name, value)), name, "non-finite")


@pytest.mark.parametrize("command", ["composition", "directions"])
def test_the_cli_warns_and_exits_0(cli, clean, tmp_path, command):
    r = cli(command, _poisoned(clean, tmp_path, f"{LAYER}.self_attn.q_proj.weight", math.nan), "-f", "json")
    assert r.exit_code == 0, r.output
    assert "internal error" not in r.stderr and "head 0" in r.stderr and "warning:" in r.stderr
