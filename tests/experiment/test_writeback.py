"""Write-back of the families beyond Llama/BERT/GPT-2 (Qwen3, Qwen3-MoE, Gemma, Gemma 2, Gemma 3, OLMo2, Phi-3,
GPT-NeoX), each on a tiny random model: writing back the layers qkinspect read leaves the logits bit for bit as they
were, and after an edit the model's own q/k/v (and q/k-norm and output) modules compute, on the model's own
inputs (forward hooks on public submodules), exactly what the edited canonical tensors say."""

from __future__ import annotations

import pytest
import torch

from qkinspect.experiment import apply_edit, parse_edit, run_experiment
from qkinspect.experiment.edits.apply import EditError
from qkinspect.experiment.model.runtime import load_hf
from qkinspect.experiment.model.scoring import Scorer, default_text, windows
from qkinspect.experiment.model.writeback import written
from qkinspect.loading import open_model
from tests.experiment import tiny_models as tiny
from tests.experiment.effects import EFFECT, moved, with_ablated_neighbour

FAMILIES = sorted(tiny.WRITEBACK_FAMILIES)
QK_NORM = ("qwen3", "qwen3_moe", "gemma3", "olmo2")
# Edits run on any heads of each family (OLMo2's q/k norm runs over the whole projection: there the form edits
# need every head of the layer at once, test_qknorm_edits.py). tie_q and share_qk give query heads their own keys
# (K/V expanded on the grouped-query models).
EDITS = {f: ("tie_q", "tie_k", "ablate") if f == "olmo2" else ("share_qk", "rank:3", "share_qkv", "tie_q")
         if f in QK_NORM else ("share_qk", "rank:3", "share_qkv") for f in FAMILIES}
T = 24


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("writeback_models")
    return {f: make(root / f) for f, make in tiny.WRITEBACK_FAMILIES.items()}


def opened(folder):
    with open_model(folder) as m:
        spec = m.info.blocks[0]
        layers = {i: m.layer(spec.key, i) for i in range(spec.n_layers)}
        hf = load_hf(m.resolved)
    return hf, layers


def logits(hf, ids):
    with torch.inference_mode():
        return hf.model(input_ids=ids, use_cache=False).logits


@pytest.mark.parametrize("family", FAMILIES)
def test_writing_back_unedited_layers_keeps_the_logits_bit_for_bit(folders, family):
    hf, layers = opened(folders[family])
    assert hf.kind == "causal"
    ids = torch.arange(5, 5 + T)[None]
    before = logits(hf, ids)
    with written(hf, list(layers.values())):
        assert torch.equal(logits(hf, ids), before)
    assert torch.equal(logits(hf, ids), before)


# -- what the modules compute after an edit --------------------------------------------------------------------

MODULES = {"llama": ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"), "phi3": ("qkv_proj", "o_proj"),
           "gpt_neox": ("query_key_value", "dense")}


def capture(hf, i: int, ids) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(input, output) of the attention module's public submodules in layer i, batch dimension dropped."""
    block = hf.layers[i]
    attn = block.attention if hf.family == "gpt_neox" else block.self_attn
    got: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def keep(name):
        return lambda m, args, out: got.__setitem__(name, (args[0][0].double(), out[0].double()))

    hooks = [getattr(attn, n).register_forward_hook(keep(n)) for n in MODULES[hf.family] if hasattr(attn, n)]
    try:
        logits(hf, ids)
    finally:
        for h in hooks:
            h.remove()
    return got


def projections(L, x):
    """q (T, H, d), k and v (T, G, d) from the canonical tensors: x W + b, in float64."""
    def proj(W, b):
        out = torch.einsum("tD,nDd->tnd", x, W.double())  # (T, D) x (n, D, d) -> (T, n, d)
        return out if b is None else out + b.double()

    return proj(L.W_Q, L.b_Q), proj(L.W_K, L.b_K), proj(L.W_V, L.b_V)


def rms_norm(y, gain, eps):
    """gain * y / sqrt(mean(y²) + eps) over the last dim."""
    return gain.double() * y * torch.rsqrt(y.square().mean(-1, keepdim=True) + eps)


def same(got, want, what, scale=None):
    """float32 module output against a float64 reference: rounding relative to `scale`, the largest sum of
    |terms| (default: the largest |want|, a product without cancellation)."""
    scale = (want.abs().max() if scale is None else scale).clamp_min(1e-30)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6 * float(scale), msg=lambda m: f"{what}: {m}")


def check_modules(hf, L, got):
    """Every captured module's output against the canonical layer L."""
    H, G, d = L.spec.n_heads, L.spec.n_kv_heads, L.spec.d_head
    if hf.family == "llama":
        x = got["q_proj"][0]
        q, k, v = projections(L, x)
        same(got["q_proj"][1], q.reshape(T, H * d), "q_proj")
        same(got["k_proj"][1], k.reshape(T, G * d), "k_proj")
        same(got["v_proj"][1], v.reshape(T, G * d), "v_proj")
        if "q_norm" in got:
            check_norms(hf, L, got, q, k)
        o_in, o_out = got["o_proj"]
    elif hf.family == "phi3":
        x, out = got["qkv_proj"]
        q, k, v = projections(L, x)
        same(out[:, : H * d], q.reshape(T, H * d), "q rows")  # sectioned [q | k | v]
        same(out[:, H * d:(H + G) * d], k.reshape(T, G * d), "k rows")
        same(out[:, (H + G) * d:], v.reshape(T, G * d), "v rows")
        o_in, o_out = got["o_proj"]
    else:  # GPT-NeoX: rows (head, [q, k, v], d)
        x, out = got["query_key_value"]
        q, k, v = projections(L, x)
        per_head = out.view(T, H, 3, d)
        for j, (name, want) in enumerate((("q", q), ("k", k), ("v", v))):
            same(per_head[:, :, j], want, f"{name} of query_key_value")
        o_in, o_out = got["dense"]
    W_O = L.W_O.double().reshape(H * d, -1)
    want_o = o_in @ W_O + (0 if L.b_O is None else L.b_O.double())
    # share_qkv's refitted value bias can be large where W_O' is small: its terms cancel in the product
    same(o_out, want_o, "output projection", scale=(o_in.abs() @ W_O.abs()).max())
    return q, k, v


def check_norms(hf, L, got, q, k):
    """The q/k-norm modules' outputs: per head with gains (d,) (Qwen3; Gemma 3's 1 + weight), or over the whole
    projection with gains (H, d) / (G, d) flattened (OLMo2)."""
    eps = hf.model.config.rms_norm_eps
    for name, y, gain in (("q_norm", q, L.q_norm), ("k_norm", k, L.k_norm)):
        out = got[name][1]
        n = y.shape[1]
        if gain.dim() == 2:  # OLMo2: one RMS over the token's whole projection
            want = rms_norm(y.reshape(T, -1), gain.reshape(-1), eps)
            same(out, want, name)
            continue
        want = rms_norm(y, gain, eps)  # (T, n, d)
        same(out if out.shape[0] == T else out.transpose(0, 1), want, name)  # Gemma 3 normalises (n, T, d)
        assert out.shape in ((T, n, L.spec.d_head), (n, T, L.spec.d_head))


@pytest.mark.parametrize("family", FAMILIES)
def test_edited_modules_compute_the_edited_canonical_tensors(folders, family):
    hf, layers = opened(folders[family])
    ids = torch.arange(5, 5 + T)[None]
    before = capture(hf, 1, ids)
    unedited = check_modules(hf, layers[1], before)
    for e in EDITS[family]:
        L = apply_edit(layers[1], parse_edit(e), heads=[1, 2]).layer
        with written(hf, [L]):
            got = capture(hf, 1, ids)
        q, k, v = check_modules(hf, L, got)
        moved = {"q": q.shape == unedited[0].shape and not torch.allclose(q, unedited[0]),
                 "k": k.shape != unedited[1].shape or not torch.allclose(k, unedited[1])}
        if e in ("share_qk", "tie_q"):
            assert moved["k"], e  # the edit reached the keys
        if e in ("rank:3", "tie_k", "share_qk"):
            assert moved["q"], e
        if e == "ablate":
            assert not L.W_O[1].any() and L.W_O[0].any()
    after = capture(hf, 1, ids)  # restored exactly
    assert all(torch.equal(after[n][1], before[n][1]) for n in before)


@pytest.mark.parametrize("family", FAMILIES)
def test_runs_from_a_cached_layer_equal_full_runs(folders, family):
    hf, layers = opened(folders[family])
    s = Scorer(hf, windows(hf, default_text(), 64, 32), batch_tokens=64)
    base = s.baseline(cache={1})
    with written(hf, [with_ablated_neighbour(layers[1], EDITS[family][0], 1)]):  # measurable: effects.py
        full = s.score(0)
        assert moved(s) > EFFECT
        full_tokens = s.token_losses
        suffix = s.score(start=1)
    assert torch.allclose(s.token_losses, full_tokens, rtol=1e-6, atol=1e-6)
    assert suffix == pytest.approx(full, rel=1e-6, abs=1e-7)
    assert s.score() == base


@pytest.mark.parametrize("family", ["qwen3", "gemma3", "olmo2"])
def test_form_edits_under_qk_norms_run_or_are_refused_saying_why(folders, family):
    if family == "olmo2":  # one RMS over every head's projection: some heads alone are not defined
        with pytest.raises(EditError, match="every head of the layer together"):
            run_experiment(folders[family], "share_qk", layers=[0], heads=[0], tokens=64, window=32)
    else:
        r = run_experiment(folders[family], "share_qk", layers=[0], heads=[0], tokens=64, window=32)
        assert [x.edit for x in r.runs] == ["share_qk", "ablate"] and all(abs(x.dloss) > EFFECT for x in r.runs)
    r = run_experiment(folders[family], "tie_q", layers=[0], heads=[0], tokens=64, window=32)
    assert [x.edit for x in r.runs] == ["tie_q", "ablate"] and all(abs(x.dloss) > EFFECT for x in r.runs)


@pytest.mark.parametrize("family", ["phi3", "gemma", "gemma2"])
def test_share_qk_scores_are_symmetric_through_the_models_own_rotation(folders, family):
    """share_qk written back: the model's q and k (its own projections, rotated by its own rotary embedding,
    partial on Phi-3) give S_ij = S_ji on the edited heads at every pair of positions, and not on the others. This
    ties the rotary layout qkinspect edits in (pairs, rotated dims) to what each family computes."""
    import importlib

    hf, layers = opened(folders[family])
    rotate = importlib.import_module(f"transformers.models.{family}.modeling_{family}").apply_rotary_pos_emb
    ids = torch.arange(5, 5 + T)[None]
    L = apply_edit(layers[1], parse_edit("share_qk"), heads=[1, 2]).layer
    with written(hf, [L]):
        got = capture(hf, 1, ids)
    H, d = L.spec.n_heads, L.spec.d_head
    if family == "phi3":
        out = got["qkv_proj"][1]
        q, k = out[:, : H * d], out[:, H * d:2 * H * d]  # keys expanded: H key heads
    else:
        q, k = got["q_proj"][1], got["k_proj"][1]
    q, k = (t.view(T, H, d).transpose(0, 1)[None] for t in (q, k))  # (T, H*d) -> (1, H, T, d)
    cos, sin = hf.model.model.rotary_emb(q.float(), torch.arange(T)[None])
    q, k = rotate(q, k, cos.double(), sin.double())
    S = (q @ k.mT)[0]  # (H, T, T): every query against every key, before the mask
    for h in range(H):
        asym = float((S[h] - S[h].T).abs().max() / S[h].abs().max())
        assert (asym < 1e-5) if h in (1, 2) else (asym > 1e-2), (h, asym)


_OPENED: dict = {}


@pytest.fixture(scope="module")
def opened_models(folders):
    for f in FAMILIES:
        _OPENED[f] = opened(folders[f])
    return _OPENED


def test_any_edit_on_any_heads_reaches_the_modules(opened_models):
    """Hypothesis: a random family, an edit defined for it, any set of heads of either layer (grouped-query
    expansions of some heads only included): the modules compute the edited tensors, and undo restores them."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=15, deadline=None, derandomize=True)
    @given(st.sampled_from(FAMILIES), st.data())
    def check(family, data):
        hf, layers = opened_models[family]
        i = data.draw(st.sampled_from(sorted(layers)))
        e = data.draw(st.sampled_from(EDITS[family] + ("ablate",)))
        heads = data.draw(st.sets(st.integers(0, 3), min_size=1))
        ids = torch.arange(5, 5 + T)[None]
        before = capture(hf, i, ids)
        L = apply_edit(layers[i], parse_edit(e), heads=sorted(heads)).layer
        with written(hf, [L]):
            check_modules(hf, L, capture(hf, i, ids))
        after = capture(hf, i, ids)
        assert all(torch.equal(after[n][1], before[n][1]) for n in before)

    check()


@pytest.mark.parametrize("family", FAMILIES)
def test_the_estimate_runs_through_each_family(folders, family):
    """--estimate's hooks find each family's attention module and output projection (self_attn.o_proj, GPT-NeoX's
    attention.dense) and re-run it with every edit written back: finite estimates, and the edit moves the outputs."""
    import math

    from qkinspect.experiment.estimate import estimate_heads

    hf, layers = opened(folders[family])
    s = Scorer(hf, windows(hf, default_text(), 64, 32), batch_tokens=64)
    s.baseline(cache={1})
    edits = [parse_edit(EDITS[family][0]), parse_edit("ablate")]
    found = estimate_heads(s, {1: layers[1]}, [0, 1], edits, probes=2)
    assert [(x.head, x.edit) for x in found] == [(h, str(e)) for h in (0, 1) for e in edits]
    assert all(math.isfinite(x.estimate) and x.moved > 0 for x in found)
