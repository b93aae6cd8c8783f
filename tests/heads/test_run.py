"""`qkinspect.heads` on tiny random models built from transformers' config classes (Llama with grouped-query
attention, GPT-2, BERT): every score recomputed by hand from the attention tensors transformers returns with
output_attentions=True on the same tokens; a GPT-2 whose first head is set by hand to attend to p − 1 scores ≈ 1 on
previous-token; the weight metrics are analyze's own; the saved document reads back the same."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import qkinspect
from qkinspect.errors import InputError
from tests.experiment import tiny_models

SMALL = dict(sequences=6, length=12, windows=3, window=24, batch=4, resamples=100, permutations=100)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("heads")
    return {name: getattr(tiny_models, name)(root / name) for name in ("llama", "gpt2", "bert")}


def _inputs(path, family_causal: bool):
    """The token ids `heads` feeds (rebuilt with its own helpers) and the transformers model, eager."""
    import contextlib

    from qkinspect.experiment.model.runtime import load_hf, load_tokenizer, staged_config
    from qkinspect.experiment.model.scoring import default_text
    from qkinspect.heads import run
    from qkinspect.heads.request import check_request
    from qkinspect.loading import open_model

    request = check_request(**{k: v for k, v in SMALL.items()})
    with open_model(str(path)) as m, contextlib.ExitStack() as stack:
        staged = stack.enter_context(staged_config(m.resolved))
        tok, _ = load_tokenizer(None, staged[0])
        hf = load_hf(m.resolved, tok, staged=staged)
    prefix, suffix = run._specials(tok, family_causal)
    text = run._windows(tok, default_text(), request, prefix, suffix, family_causal)
    rand = run._repeated(tok, hf.model.config, request, prefix, suffix, family_causal)
    hf.model.set_attn_implementation("eager")
    return hf, text, rand, prefix


def _by_hand(attn: torch.Tensor, causal: bool, prefix: int, n: int | None):
    """Per (sequence, head) scores from one layer's (B, H, T, T) attention, written out position by position."""
    B, H, T, _ = attn.shape
    out: dict[str, np.ndarray] = {}
    for b in range(B):
        for h in range(H):
            a = attn[b, h].double()
            if n is None:
                start = 1 if causal else 0
                vals = {"previous_token": np.mean([a[p, p - 1].item() for p in range(1, T)]),
                        "self": np.mean([a[p, p].item() for p in range(start, T)]),
                        "first_token": np.mean([a[p, 0].item() for p in range(1, T)]),
                        "entropy": np.mean([-sum(x * math.log(x) for x in a[p, :(p + 1 if causal else T)].tolist()
                                                 if x > 0) / math.log(p + 1 if causal else T)
                                            for p in range(start, T)])}
            else:
                qs = range(prefix + n, prefix + 2 * n)
                vals = {"duplicate_token": np.mean([a[p, p - n].item() for p in qs])}
                if causal:
                    vals["induction"] = np.mean([a[p, p - n + 1].item() for p in qs])
            for k, v in vals.items():
                out.setdefault(k, np.zeros((B, H)))[b, h] = v
    return out


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert"])
def test_scores_equal_a_computation_by_hand_from_output_attentions(folders, name):
    causal = name != "bert"
    result = qkinspect.heads(str(folders[name]), **SMALL)
    hf, text, rand, prefix = _inputs(folders[name], causal)
    per: dict[str, list] = {}
    with torch.no_grad():
        for ids, n in ((text, None), (rand, SMALL["length"])):
            attentions = hf.model(input_ids=ids, output_attentions=True).attentions
            for layer, attn in enumerate(attentions):
                for k, v in _by_hand(attn, causal, prefix, n).items():
                    per.setdefault(k, [None] * len(attentions))[layer] = v  # (sequences, heads)
    for r in result.records:
        for k, layers in per.items():
            v = layers[r.layer][:, r.head]
            assert r.scores[k] == pytest.approx(v.mean(), abs=1e-6), (k, r.layer, r.head)
            assert r.errors[k] == pytest.approx(v.std(ddof=1) / math.sqrt(len(v)), abs=1e-6)
    if not causal:
        assert all(r.scores["induction"] is None for r in result.records)


def test_query_heads_say_their_key_value_head_and_carry_analyzes_metrics(folders):
    result = qkinspect.heads(str(folders["llama"]), **SMALL)
    weights = qkinspect.analyze(str(folders["llama"]), spectra=None)
    by = {(h.layer, h.head): h for h in weights.heads}
    assert [r.kv_head for r in result.records if r.layer == 0] == [0, 0, 1, 1]  # 4 query heads read 2 kv heads
    for r in result.records:
        for m, v in r.weights.items():
            want = by[(r.layer, r.head)].values[m]
            assert (v is None and not np.isfinite(want)) or v == pytest.approx(want)
    row = result.rows()[0]
    assert {"layer", "head", "kv_head", "induction", "induction_se", "symmetry"} <= set(row)


def test_relations_are_spearman_over_the_records(folders):
    from scipy.stats import spearmanr

    result = qkinspect.heads(str(folders["llama"]), **SMALL)
    x = [r.weights["symmetry"] for r in result.records]
    y = [r.scores["self"] for r in result.records]
    assert result.relation("symmetry", "self").rho == pytest.approx(spearmanr(x, y).statistic)
    layer1 = [r for r in result.records if r.layer == 1]
    rho1 = spearmanr([r.weights["symmetry"] for r in layer1], [r.scores["self"] for r in layer1]).statistic
    assert result.relation("symmetry", "self", "layer", 1).rho == pytest.approx(rho1)
    assert {r.scope for r in result.relations} == {"all", "within", "layer"}


def previous_token_gpt2(folder):
    """GPT-2 whose layer-0 head 0 attends to p − 1: token embeddings zero, position p embedded as e_p, and
    W_Q W_Kᵀ = c S with S[p, p − 1] = 1 on the position dimensions (the input LayerNorm maps every one-hot
    alike, a e_p − b 1, which changes each row's scores by a constant only)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_embd=64, n_layer=1, n_head=2, n_positions=24, vocab_size=len(tiny_models.VOCAB))
    model = GPT2LMHeadModel(config).eval()
    D, d = 64, 32
    with torch.no_grad():
        model.transformer.wte.weight.zero_()
        model.transformer.wpe.weight.copy_(torch.eye(24, D))
        ln = model.transformer.h[0].ln_1
        ln.weight.fill_(1.0)
        ln.bias.zero_()
        w = model.transformer.h[0].attn.c_attn.weight  # Conv1D: (in D, out 3D), [q | k | v], head 0 first
        b = model.transformer.h[0].attn.c_attn.bias
        w[:, :d].zero_()
        w[:, D:D + d].zero_()
        b[:D + D].zero_()
        for p in range(1, d):
            w[p, p - 1] = 30.0  # W_Q[p, p-1]
        for j in range(d):
            w[j, D + j] = 1.0  # W_K = I on the first d dimensions
    model.save_pretrained(folder)
    return tiny_models.save_tokenizer(folder)


def test_a_hand_set_previous_token_head_scores_one(tmp_path):
    path = previous_token_gpt2(tmp_path / "prev")
    result = qkinspect.heads(str(path), **{**SMALL, "length": 10, "window": 20})
    rec = {(r.layer, r.head): r for r in result.records}
    assert rec[(0, 0)].scores["previous_token"] > 0.99
    assert rec[(0, 1)].scores["previous_token"] < 0.5
    assert result.top("previous_token", 1)[0].head == 0


def test_saved_document_reads_back_the_same(folders, tmp_path):
    from qkinspect.heads.saved import is_heads, read

    result = qkinspect.heads(str(folders["bert"]), **SMALL)
    path = result.save(tmp_path / "h.json")
    assert is_heads(path) and not is_heads(tmp_path / "nope.json")
    assert read(path).document() == result.document()


@pytest.mark.parametrize("option, value, words", [
    ("sequences", 0, "sequences=0"), ("length", 40, "length=40"), ("window", 100, "window=100"),
    ("relate", "cka_qk", "relate='cka_qk'"), ("metrics", "nope", "metrics"), ("length", 1, "length=1")])
def test_bad_requests_name_the_argument(folders, option, value, words):
    with pytest.raises(InputError, match=words):
        qkinspect.heads(str(folders["llama"]), **{**SMALL, "metrics": "symmetry", "relate": "symmetry",
                                                   option: value})


def test_a_text_too_short_for_one_window(folders, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("ab cd")
    with pytest.raises(InputError, match="text .*short.txt: .* fewer than one window"):
        qkinspect.heads(str(folders["gpt2"]), **{**SMALL, "text": short})


def test_a_model_in_memory_runs_where_it_is_and_keeps_its_kernel(folders):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folders["llama"], attn_implementation="sdpa")
    in_memory = qkinspect.heads(model, tokenizer=str(folders["llama"]), **SMALL)
    seen = []  # switched back: sdpa's attention modules return no probabilities, eager's would
    handle = model.model.layers[0].self_attn.register_forward_hook(lambda m, a, out: seen.append(out[1]))
    with torch.no_grad():
        model(input_ids=torch.tensor([[5, 6, 7]]))
    handle.remove()
    assert seen == [None]
    from_folder = qkinspect.heads(str(folders["llama"]), **SMALL)
    for a, b in zip(in_memory.records, from_folder.records, strict=True):
        for k, v in a.scores.items():
            assert v == pytest.approx(b.scores[k], abs=1e-6), (a.layer, a.head, k)
