"""`qkinspect.directions`: singular directions of W_OV and W_QK read as tokens, against dense float64 references
(the full d_model × d_model matrices formed from the models' own modules, SVD'd), on heads built to read and write
known tokens, for GQA, tied and untied embeddings, a final norm with and without Gemma's unit offset, and GGUF."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qkinspect
from qkinspect.metrics.directions import GAP, factored_svd, subspaces

D, d, H, G, V = 32, 8, 4, 2, 60


def llama_lm(*, tie: bool = False, seed: int = 0, kv: int = G, gemma: bool = False):
    """A tiny causal LM (Llama, or Gemma3 with `gemma`) with random norm gains, final norm included."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    kw = dict(vocab_size=V, hidden_size=D, intermediate_size=48, num_hidden_layers=2, num_attention_heads=H,
              num_key_value_heads=kv, head_dim=d, max_position_embeddings=16, tie_word_embeddings=tie)
    model = (Gemma3ForCausalLM(Gemma3TextConfig(**kw, sliding_window=8)) if gemma
             else LlamaForCausalLM(LlamaConfig(**kw))).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif p.dim() == 2:
                p.normal_(0, 0.3)
    return model


def save(model, folder):
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def head_factors(model, layer: int, h: int):
    """W_Q, W_K, W_V (D, d) and W_O (d, D) of query head h (its KV head h // rep) from the model's own modules."""
    a = model.model.layers[layer].self_attn
    g = h // (H // (a.k_proj.weight.shape[0] // d))  # its KV head, never h % n_kv
    rows = slice(h * d, (h + 1) * d)
    kv_rows = slice(g * d, (g + 1) * d)
    f = {k: w.detach().double() for k, w in (("q", a.q_proj.weight[rows]), ("k", a.k_proj.weight[kv_rows]),
                                             ("v", a.v_proj.weight[kv_rows]), ("o", a.o_proj.weight[:, rows]))}
    return f["q"].T, f["k"].T, f["v"].T, f["o"].T


def dense_tokens(M: torch.Tensor, T_read: torch.Tensor, T_write: torch.Tensor, i: int, n: int):
    """From the dense M (D, D): (+ ids, - ids) of the left vector against T_read, of the right vector against
    T_write, with the orientation fixed as the library fixes it (v's largest-magnitude entry positive)."""
    U, S, Vh = torch.linalg.svd(M)
    u, v = U[:, i], Vh[i]
    if v[v.abs().argmax()] < 0:
        u, v = -u, -v
    def ids(T, w):
        s = T @ w
        return torch.topk(s, n).indices.tolist(), torch.topk(-s, n).indices.tolist()
    return S, ids(T_read, u), ids(T_write, v)


def dense_top_directions(model, T_read, T_write, n: int = 5):
    """For every (layer, head, matrix, side) of the tiny LM: (key, σ, + ids, - ids) of the top direction from the
    dense SVD, OV's write side read through `T_write`, every other side through `T_read`."""
    for layer in range(2):
        for h in range(H):
            Wq, Wk, Wv, Wo = head_factors(model, layer, h)
            for matrix, M, sides in (("ov", Wv @ Wo, ("read", "write")), ("qk", Wq @ Wk.T, ("query", "key"))):
                S, read_ids, write_ids = dense_tokens(M, T_read, T_write if matrix == "ov" else T_read, 0, n)
                for side, (plus, minus) in zip(sides, (read_ids, write_ids), strict=True):
                    yield (layer, h, matrix, side), S, plus, minus


def by_key(result):
    return {(r.layer, r.head, r.matrix, r.side, r.index, r.sign): r for r in result.records}


@pytest.mark.parametrize("tie,gemma", [(False, False), (True, False), (True, True)],
                         ids=["llama-untied", "llama-tied", "gemma3-tied-unit-offset"])
def test_every_direction_matches_the_dense_float64_svd(tmp_path, tie, gemma):
    model = llama_lm(tie=tie, gemma=gemma)
    res = qkinspect.directions(save(model, tmp_path / "m"), top_directions=3, top_tokens=5, precision="float64")
    assert res.readout.tied is tie
    E = model.model.embed_tokens.weight.detach().double()
    gain = model.model.norm.weight.detach().double() + (1.0 if gemma else 0.0)
    Uw = (E if tie else model.lm_head.weight.detach().double()) * gain  # γ ∘ w_t per token
    got = by_key(res)
    checked = 0
    for (layer, h, matrix, side), S, plus, minus in dense_top_directions(model, E, Uw):
        if (layer, h, matrix, side, 0, "+") not in got:  # a degenerate top pair (checked elsewhere)
            assert got[(layer, h, matrix, side, 0, "±")].indices[0] == 0
            continue
        assert got[(layer, h, matrix, side, 0, "+")].sigma == pytest.approx(float(S[0]), rel=1e-9)
        assert list(got[(layer, h, matrix, side, 0, "+")].token_ids) == plus
        assert list(got[(layer, h, matrix, side, 0, "-")].token_ids) == minus
        checked += 1
    assert checked >= 24


def test_the_default_float32_gives_the_same_top_tokens(tmp_path):
    folder = save(llama_lm(), tmp_path / "m")
    a = by_key(qkinspect.directions(folder, top_directions=2, top_tokens=3))
    b = by_key(qkinspect.directions(folder, top_directions=2, top_tokens=3, precision="float64"))
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].token_ids == b[k].token_ids
        assert a[k].sigma == pytest.approx(b[k].sigma, rel=1e-4)


def plant(model, layer: int, h: int, *, read: torch.Tensor, write: torch.Tensor, query: torch.Tensor,
          key: torch.Tensor, scale: float = 3.0, second: tuple | None = None):
    """Make head h of `layer` a rank-one (or two, `second` = (read2, write2, scale2)) W_OV = s · read ⊗ write and
    W_QK = s · query ⊗ key, through the model's own projections (unit vectors in, row-vector convention)."""
    a = model.model.layers[layer].self_attn
    g = h // (H // G)
    with torch.no_grad():
        a.v_proj.weight[g * d:(g + 1) * d] = 0
        a.o_proj.weight[:, h * d:(h + 1) * d] = 0
        a.q_proj.weight[h * d:(h + 1) * d] = 0
        a.k_proj.weight[g * d:(g + 1) * d] = 0
        a.v_proj.weight[g * d] = scale * read  # W_V[g][:, 0] = s · read
        a.o_proj.weight[:, h * d] = write  # W_O[h][0, :] = write
        a.q_proj.weight[h * d] = scale * query
        a.k_proj.weight[g * d] = key
        if second is not None:
            read2, write2, s2 = second
            a.v_proj.weight[g * d + 1] = s2 * read2
            a.o_proj.weight[:, h * d + 1] = write2


def unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm()


def planted(tie: bool = False):
    model = llama_lm(tie=tie, seed=1)
    E = model.model.embed_tokens.weight.detach()
    gain = model.model.norm.weight.detach()
    Uw = E if tie else model.lm_head.weight.detach()
    # the write vector that raises token 7's logit most: its unembedding row times the final gain
    plant(model, 1, 3, read=unit(E[11]), write=unit(gain * Uw[7]), query=unit(E[20]), key=unit(E[30]))
    return model


def test_a_head_built_to_write_a_token_reads_back_as_that_token(tmp_path):
    res = qkinspect.directions(save(planted(), tmp_path / "m"), layers="1", heads="3", top_directions=2,
                               top_tokens=3)
    got = by_key(res)
    assert {k[4] for k in got} == {0}  # rank one: the zero directions are dropped
    top = {(side, sign): got[(1, 3, m, side, 0, sign)].token_ids[0] for m, side in
           (("ov", "read"), ("ov", "write"), ("qk", "query"), ("qk", "key")) for sign in "+-"}
    write_sign = next(s for s in "+-" if top[("write", s)] == 7)
    assert top[("read", write_sign)] == 11  # reading +u writes +σv: the signs pair up
    key_sign = next(s for s in "+-" if top[("key", s)] == 30)
    assert top[("query", key_sign)] == 20
    assert got[(1, 3, "ov", "write", 0, "+")].sigma == pytest.approx(3.0, rel=1e-5)


def test_without_the_final_gain_folded_the_planted_token_is_not_what_the_head_writes(tmp_path):
    """The planted direction is γ ∘ u_7: its tokens through the bare unembedding differ from the folded reading
    in their scores (so the gain is really applied)."""
    model = planted()
    res = qkinspect.directions(save(model, tmp_path / "m"), layers="1", heads="3", top_directions=1, top_tokens=5)
    rec = next(r for r in res.records if r.side == "write" and r.token_ids[0] == 7)
    Uw = model.lm_head.weight.detach().double()
    gain = model.model.norm.weight.detach().double()
    v = unit(gain * Uw[7])  # the record with token 7 on top reads the planted orientation, whatever its sign
    expected = ((Uw * gain) @ v)[list(rec.token_ids)]
    assert torch.allclose(torch.tensor(rec.scores, dtype=torch.float64), expected, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(torch.tensor(rec.scores, dtype=torch.float64), (Uw @ v)[list(rec.token_ids)],
                              rtol=1e-2)


def test_negating_w_o_swaps_the_read_signs_and_keeps_the_write_side(tmp_path):
    model = planted()
    a = by_key(qkinspect.directions(save(model, tmp_path / "a"), layers="1", heads="3", top_directions=1))
    with torch.no_grad():
        model.model.layers[1].self_attn.o_proj.weight.neg_()
    b = by_key(qkinspect.directions(save(model, tmp_path / "b"), layers="1", heads="3", top_directions=1))
    flip = {"+": "-", "-": "+"}
    for s in "+-":
        assert b[(1, 3, "ov", "write", 0, s)].token_ids == a[(1, 3, "ov", "write", 0, s)].token_ids
        assert b[(1, 3, "ov", "read", 0, s)].token_ids == a[(1, 3, "ov", "read", 0, flip[s])].token_ids


@pytest.mark.parametrize("ratio,together", [(1.0, True), (1.04, True), (1.06, False)])
def test_near_equal_singular_values_are_read_as_one_subspace(tmp_path, ratio, together):
    model = llama_lm(seed=2)
    E = model.model.embed_tokens.weight.detach()
    Uw, gain = model.lm_head.weight.detach(), model.model.norm.weight.detach()
    w1, w2 = unit(gain * Uw[5]), unit(gain * Uw[9])
    w2 = unit(w2 - (w2 @ w1) * w1)  # orthonormal write pair
    r1, r2 = unit(E[3]), unit(E[4])
    r2 = unit(r2 - (r2 @ r1) * r1)
    plant(model, 0, 0, read=r1, write=w1, query=r1, key=r1, scale=3.0 * ratio, second=(r2, w2, 3.0))
    res = qkinspect.directions(save(model, tmp_path / "m"), layers="0", heads="0", top_directions=2, top_tokens=6,
                               precision="float64")
    writes = [r for r in res.records if r.side == "write"]
    if not together:
        assert [(r.indices, r.sign) for r in writes] == [((0,), "+"), ((0,), "-"), ((1,), "+"), ((1,), "-")]
        return
    (rec,) = writes
    assert rec.sign == "±" and rec.indices == (0, 1) and rec.sigmas == pytest.approx((3.0 * ratio, 3.0))
    basis = torch.stack([w1, w2], 1).double()  # (D, 2) orthonormal: the subspace the head writes
    norms = ((Uw.double() * gain.double()) @ basis).norm(dim=1)
    assert list(rec.token_ids) == torch.topk(norms, 6).indices.tolist()
    # the planted vectors are stored in float32: their span is orthonormal to float32 rounding only
    assert rec.scores == pytest.approx(torch.topk(norms, 6).values.tolist(), rel=1e-6)


def test_grouped_query_pairing_equals_an_expanded_multi_head_copy(tmp_path):
    gqa = llama_lm(seed=4)
    mha = llama_lm(seed=5, kv=H)
    sd = gqa.state_dict()
    rep = H // G
    for k, w in sd.items():
        if k.endswith(("k_proj.weight", "v_proj.weight")):
            sd[k] = w.reshape(G, d, D).repeat_interleave(rep, dim=0).reshape(H * d, D)  # kv head g -> heads g*rep..
    mha.load_state_dict(sd)
    a = qkinspect.directions(save(gqa, tmp_path / "gqa"), top_directions=3, top_tokens=4, precision="float64")
    b = qkinspect.directions(save(mha, tmp_path / "mha"), top_directions=3, top_tokens=4, precision="float64")
    assert [(r.layer, r.head, r.matrix, r.side, r.indices, r.sign, r.token_ids) for r in a.records] == \
           [(r.layer, r.head, r.matrix, r.side, r.indices, r.sign, r.token_ids) for r in b.records]
    assert [r.sigma for r in a.records] == pytest.approx([r.sigma for r in b.records], rel=1e-9)
    assert {r.kv_head for r in a.records if r.head == 3} == {1}  # 3 // 2, never 3 % 2


def test_the_factored_svd_is_the_dense_one_and_blocks_follow_the_gap():
    torch.manual_seed(0)
    A, B = torch.randn(3, 40, 6, dtype=torch.float64), torch.randn(3, 40, 6, dtype=torch.float64)
    U, S, Vt = factored_svd(A, B)
    M = A @ B.mT
    assert torch.allclose(U @ torch.diag_embed(S) @ Vt.mT, M, atol=1e-10)
    assert torch.allclose(S, torch.linalg.svdvals(M)[:, :6], rtol=1e-10)
    assert (Vt.gather(-2, Vt.abs().argmax(-2, keepdim=True)) > 0).all()
    assert subspaces(torch.tensor([2.0, 2.0 / GAP * 1.001, 1.0, 0.0]), 3) == [(0, 1), (2,)]
    assert subspaces(torch.tensor([2.0, 1.0, 1.0, 1.0]), 2) == [(0,), (1, 2, 3)]  # the block reaching K is whole
    assert subspaces(torch.tensor([1.0, 1e-7]), 2) == [(0,)]  # below the rank cut


def test_a_gpt2_and_a_bert_read_through_their_own_tensors(tmp_path):
    from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=D, n_layer=1, n_head=4, n_positions=16)).eval()
    with torch.no_grad():
        gpt2.transformer.ln_f.weight.uniform_(0.5, 1.5)
    res = qkinspect.directions(save(gpt2, tmp_path / "gpt2"), top_directions=1, top_tokens=4, precision="float64")
    assert res.readout.tied and res.readout.final_norm.endswith("ln_f.weight")
    c = gpt2.transformer.h[0].attn
    Wq, Wk, Wv = c.c_attn.weight.detach().double().split(D, dim=1)  # Conv1D stores (in, out): sections q|k|v
    Wo = c.c_proj.weight.detach().double()
    E = gpt2.transformer.wte.weight.detach().double()
    gain = gpt2.transformer.ln_f.weight.detach().double()
    h = 2
    cols = slice(h * 8, (h + 1) * 8)
    _, _, (plus, minus) = dense_tokens(Wv[:, cols] @ Wo[cols], E, E * gain, 0, 4)
    got = by_key(res)
    assert list(got[(0, h, "ov", "write", 0, "+")].token_ids) == plus
    assert list(got[(0, h, "ov", "write", 0, "-")].token_ids) == minus

    bert = BertForMaskedLM(BertConfig(vocab_size=V, hidden_size=D, num_hidden_layers=1, num_attention_heads=4,
                                      intermediate_size=40, max_position_embeddings=16)).eval()
    res = qkinspect.directions(save(bert, tmp_path / "bert"), top_directions=1, top_tokens=4)
    assert res.readout.tied and res.readout.final_norm is None
    assert res.readout.unembedding.endswith("embeddings.word_embeddings.weight")


def test_a_gguf_reads_its_embedded_vocabulary_and_output_tensors(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from tests.experiment import tiny_gguf

    path = tiny_gguf.llama_gguf(tmp_path / "m.gguf")
    tokens = tiny_gguf.byte_tokens()
    torch.manual_seed(0)  # the same weights as the GGUF's, as Hugging Face stores them
    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, intermediate_size=96, vocab_size=len(tokens), max_position_embeddings=64,
                      rms_norm_eps=1e-5, tie_word_embeddings=False)
    hf = save(LlamaForCausalLM(cfg), tmp_path / "hf")
    a = qkinspect.directions(path, top_directions=2, top_tokens=4, precision="float64")
    b = qkinspect.directions(hf, top_directions=2, top_tokens=4, precision="float64")
    assert not a.readout.tied and a.readout.unembedding == "lm_head.weight"
    assert a.readout.final_norm == "model.norm.weight" and a.readout.tokenizer.endswith("(tokenizer.ggml.tokens)")
    assert [r.token_ids for r in a.records] == [r.token_ids for r in b.records]
    assert [r.sigma for r in a.records] == pytest.approx([r.sigma for r in b.records], rel=1e-6)
    byte = {c: bytes([b]) for b, c in bytes_to_unicode().items()}
    for r in a.records:
        for i, text in zip(r.token_ids, r.tokens, strict=True):
            raw = tokens[i]
            want = raw if raw.startswith("<") else b"".join(byte[c] for c in raw).decode("utf-8", "backslashreplace")
            assert text == want
    assert all(t is None for r in b.records for t in r.tokens) and b.readout.tokenizer is None  # ids only


def test_the_demo_reads_its_tokenizer_and_the_document_round_trips():
    res = qkinspect.directions(None, layers="0", heads="1", top_directions=1, top_tokens=3)
    assert res.readout.tokenizer.endswith("tokenizer.json") and res.readout.tokenizer_size == 30522
    assert all(isinstance(t, str) for r in res.records for t in r.tokens)
    doc = json.loads(json.dumps(res.document()))
    assert doc["kind"] == "directions" and doc["directions"][0]["token_ids"] == list(res.records[0].token_ids)


def test_fold_ln_reads_the_directions_of_the_gain_scaled_projections(tmp_path):
    model = llama_lm(seed=6)
    res = qkinspect.directions(save(model, tmp_path / "m"), layers="1", top_directions=1, top_tokens=4,
                               precision="float64", fold_ln=True)
    assert res.processing["fold_ln"] and not any("input norms not folded" in n for n in res.notes)
    E = model.model.embed_tokens.weight.detach().double()
    Uw = model.lm_head.weight.detach().double() * model.model.norm.weight.detach().double()
    gamma = model.model.layers[1].input_layernorm.weight.detach().double()[:, None]  # (D, 1): diag(γ) W
    got = by_key(res)
    for h in range(H):
        Wq, Wk, Wv, Wo = head_factors(model, 1, h)
        for matrix, M, sides in (("ov", (gamma * Wv) @ Wo, ("read", "write")),
                                 ("qk", (gamma * Wq) @ (gamma * Wk).T, ("query", "key"))):
            _, read_ids, write_ids = dense_tokens(M, E, Uw if matrix == "ov" else E, 0, 4)
            for side, (plus, minus) in zip(sides, (read_ids, write_ids), strict=True):
                if (1, h, matrix, side, 0, "+") in got:
                    assert list(got[(1, h, matrix, side, 0, "+")].token_ids) == plus
                    assert list(got[(1, h, matrix, side, 0, "-")].token_ids) == minus


# -- issue 39: the cosine reading, and a near-equal run capped past K ------------------------------------------------

def test_the_cosine_reading_matches_the_dense_float64_reference(tmp_path):
    """Each token's dot product divided by its vector's norm (‖e_t‖; ‖γ ∘ w_t‖ on the write side)."""
    model = llama_lm(tie=False)
    res = qkinspect.directions(save(model, tmp_path / "m"), top_directions=2, top_tokens=5, precision="float64",
                               reading="cosine")
    assert res.processing["reading"] == "cosine" and any("cosines" in n for n in res.notes)
    E = model.model.embed_tokens.weight.detach().double()
    Uw = model.lm_head.weight.detach().double() * model.model.norm.weight.detach().double()
    En, Un = E / E.norm(dim=1, keepdim=True), Uw / Uw.norm(dim=1, keepdim=True)
    got = by_key(res)
    checked = 0
    for (layer, h, matrix, side), _, plus, minus in dense_top_directions(model, En, Un):
        r = got.get((layer, h, matrix, side, 0, "+"))
        if r is None:
            continue
        assert list(r.token_ids) == plus
        assert list(got[(layer, h, matrix, side, 0, "-")].token_ids) == minus
        assert all(-1 - 1e-9 <= s <= 1 + 1e-9 for s in r.scores)
        checked += 1
    assert checked >= 24


def test_a_hub_token_with_a_long_row_fills_the_dot_lists_not_the_cosine_ones(tmp_path):
    model = llama_lm(tie=True)
    hub = 7
    with torch.no_grad():
        model.model.embed_tokens.weight[hub] *= 40.0  # a rare token with a long embedding row
    folder = save(model, tmp_path / "m")

    def share(reading):
        res = qkinspect.directions(folder, top_directions=2, top_tokens=3, reading=reading)
        return sum(hub in r.token_ids for r in res.records) / len(res.records)

    dot, cosine = share("dot"), share("cosine")
    assert dot > 0.4  # the hub tops one sign's list of almost every direction by its length alone
    assert cosine < dot / 3, (dot, cosine)


def test_a_bad_reading_is_refused():
    from qkinspect.errors import InputError

    with pytest.raises(InputError, match="reading=.dots."):
        qkinspect.directions(None, reading="dots")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.5, 2.0), min_size=1, max_size=40), st.integers(1, 8))
def test_a_near_equal_run_grows_at_most_k_past_k(ratios, k):
    """Blocks cover min(k, rank) directions at least, never reach past index 2k − 1, and `continues` is true exactly
    where the last block's run could have gone on."""
    from qkinspect.metrics.directions import continues

    s = [10.0]
    for r in ratios:
        s.append(s[-1] / max(r, 1.0))  # non-increasing, with many near-equal neighbours
    S = torch.tensor(s, dtype=torch.float64)
    blocks = subspaces(S, k)
    flat = [i for b in blocks for i in b]
    assert flat == list(range(len(flat)))  # consecutive, from the first
    assert len(flat) >= min(k, len(s)) and flat[-1] <= 2 * k - 1
    uncut = subspaces(S, k, past=len(s))
    assert continues(S, blocks) == (uncut != blocks)
    assert continues(S, uncut) is False


def test_the_cli_shows_the_reading_and_a_cut_run(tmp_path):
    from typer.testing import CliRunner

    from qkinspect.cli.app import app

    model = llama_lm()
    with torch.no_grad():  # head 0 of layer 0: a flat W_OV spectrum (every σ equal): one run, cut at 2K
        a = model.model.layers[0].self_attn
        a.v_proj.weight[:d] = torch.eye(D)[:d] * 2.0
        a.o_proj.weight[:, :d] = torch.eye(D)[:, :d]
    folder = save(model, tmp_path / "m")
    r = CliRunner().invoke(app, ["directions", str(folder), "--layers", "0", "--heads", "0", "-k", "2",
                                 "--reading", "cosine", "--format", "table"])
    assert r.exit_code == 0, r.output
    assert "0-3+" in r.stdout and "the near-equal run goes on" in r.stdout and "cosines" in r.stdout
    r = CliRunner().invoke(app, ["directions", str(folder), "--layers", "0", "--heads", "0", "-k", "2", "-f", "json"])
    ov = [x for x in json.loads(r.stdout)["directions"] if x["matrix"] == "ov"]
    assert {tuple(x["indices"]) for x in ov} == {(0, 1, 2, 3)} and all(x["cut"] for x in ov)
