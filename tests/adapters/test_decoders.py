"""Decoder-only families with separate q/k/v/o projections: the canonical matrices reproduce the model's own
query, key and value states (captured on the projection modules in a real forward pass, so before any rotary
embedding), the output projection, and the pre-attention norm used by --fold-ln."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
import transformers as tf

from qkinspect.loading import open_model
from tests.adapters.harness import (
    apply_norm,
    assert_close,
    assert_heads,
    capture,
    load_layers,
    output_proj,
    per_head,
    randomize,
    save_tiny,
    split_heads,
)

D, L, H, G, V = 64, 2, 4, 2, 99


@dataclass
class Case:
    config: tf.PretrainedConfig
    attn: str = "self_attn"  # attribute path of a decoder layer to its attention module
    proj: tuple[str, str, str, str] = ("q_proj", "k_proj", "v_proj", "o_proj")
    norm: str | None = "input_layernorm"  # attribute of a decoder layer: the norm feeding attention
    layers: str = "layers"  # attribute path from the base model to its list of layers
    qk: tuple[str, str] | None = None  # q/k norm modules inside the attention module
    expect: dict = field(default_factory=dict)  # BlockSpec fields the adapter must set
    post_ln: bool = False  # OPT-350m: attention reads the previous layer's final_layer_norm


def llama_like(cls, **kw):
    base = dict(hidden_size=D, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=G,
                intermediate_size=64, vocab_size=V)
    return cls(**{**base, **kw})


def opt(**kw):
    return tf.OPTConfig(hidden_size=D, num_hidden_layers=L, ffn_dim=64, num_attention_heads=H, vocab_size=V,
                        word_embed_proj_dim=D, max_position_embeddings=32, **kw)


OPT = dict(layers="decoder.layers", proj=("q_proj", "k_proj", "v_proj", "out_proj"), norm="self_attn_layer_norm")
NEO = dict(layers="h", attn="attn.attention", proj=("q_proj", "k_proj", "v_proj", "out_proj"), norm="ln_1")
GPTJ = dict(layers="h", attn="attn", proj=("q_proj", "k_proj", "v_proj", "out_proj"), norm="ln_1")
PHI = dict(proj=("q_proj", "k_proj", "v_proj", "dense"))
QK = ("q_norm", "k_norm")
GEMMA = dict(head_dim=24, num_key_value_heads=1)  # 4 heads x 24 != 64: d_head * n_heads need not be d_model
MOE = dict(num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32)

CASES = {
    "llama": Case(llama_like(tf.LlamaConfig), expect=dict(n_kv_heads=G, positional="rope", rotary_dims=16)),
    "llama-bias-mqa": Case(llama_like(tf.LlamaConfig, attention_bias=True, num_key_value_heads=1),
                           expect=dict(n_kv_heads=1)),
    "mistral": Case(llama_like(tf.MistralConfig, sliding_window=4), expect=dict(attention_kind="sliding")),
    "mixtral": Case(llama_like(tf.MixtralConfig, num_local_experts=2, num_experts_per_tok=1)),
    "qwen2": Case(llama_like(tf.Qwen2Config), expect=dict(qk_norm=False)),
    "qwen2_moe": Case(llama_like(tf.Qwen2MoeConfig, shared_expert_intermediate_size=32, **MOE)),
    "qwen3": Case(llama_like(tf.Qwen3Config, head_dim=16), qk=QK, expect=dict(qk_norm=True)),
    "qwen3_moe": Case(llama_like(tf.Qwen3MoeConfig, head_dim=16, **MOE), qk=QK),
    "gemma": Case(llama_like(tf.GemmaConfig, **GEMMA), expect=dict(d_head=24, n_kv_heads=1)),
    "gemma2": Case(llama_like(tf.Gemma2Config, query_pre_attn_scalar=20, **GEMMA),
                   expect=dict(d_head=24, scale=20**-0.5, attention_kind="full+sliding")),
    "gemma3_text": Case(llama_like(tf.Gemma3TextConfig, query_pre_attn_scalar=20, **GEMMA), qk=QK,
                        expect=dict(d_head=24, scale=20**-0.5, qk_norm=True)),
    "olmo2": Case(llama_like(tf.Olmo2Config), norm=None, qk=QK, expect=dict(qk_norm=True)),
    "phi": Case(llama_like(tf.PhiConfig, partial_rotary_factor=0.5), **PHI, expect=dict(rotary_dims=8)),
    "phi-qk-layernorm": Case(llama_like(tf.PhiConfig, qk_layernorm=True, num_key_value_heads=H), **PHI,
                             qk=("q_layernorm", "k_layernorm"), expect=dict(qk_norm=True)),
    "opt": Case(opt(), **OPT, expect=dict(positional="absolute")),
    "opt-post-ln": Case(opt(do_layer_norm_before=False), **OPT, post_ln=True),
    "gpt_neo": Case(tf.GPTNeoConfig(hidden_size=D, num_layers=L, num_heads=H, window_size=4, vocab_size=V,
                                    attention_types=[[["global", "local"], 1]], max_position_embeddings=32,
                                    intermediate_size=64),
                    **NEO, expect=dict(scale=1.0, positional="absolute", attention_kind="full+local")),
    "gptj": Case(tf.GPTJConfig(n_embd=D, n_layer=L, n_head=H, rotary_dim=8, n_positions=32, vocab_size=V, n_inner=64),
                 **GPTJ, expect=dict(positional="rope", rotary_dims=8)),
}


def build(case: Case, tmp_path):
    torch.manual_seed(0)
    model = tf.AutoModel.from_config(case.config, attn_implementation="eager")
    randomize(model)
    path = save_tiny(model, tmp_path / "m")
    return model, path


def get_attr(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def norm_module(case: Case, blocks, i: int):
    """The module whose output layer i's attention reads (None: the raw residual stream / embeddings)."""
    if case.post_ln:
        return blocks[i - 1].final_layer_norm if i > 0 else None
    return getattr(blocks[i], case.norm) if case.norm else None


def watched(case: Case, blocks, i: int) -> list[torch.nn.Module]:
    """q, k, v, o projection modules of layer i, its q/k norms, then the norm feeding it (if any)."""
    attn = get_attr(blocks[i], case.attn)
    mods = [getattr(attn, p) for p in case.proj] + [getattr(attn, p) for p in case.qk or ()]
    norm = norm_module(case, blocks, i)
    return mods + ([norm] if norm is not None else [])


def check_layer(ours, rec, mods, has_norm: bool, qk: bool) -> None:
    """Compare one layer's canonical matrices with the projections captured in the model's own forward pass."""
    (xq, _, q), (xk, _, k), (xv, _, v), (xo, _, o) = (r[0] for r in rec[:4])
    s, i = ours.spec, ours.layer
    assert_heads(xq[0], ours.W_Q, ours.b_Q, split_heads(q, s.n_heads, s.d_head), f"layer {i} Q")
    assert_heads(xk[0], ours.W_K, ours.b_K, split_heads(k, s.n_kv_heads, s.d_head), f"layer {i} K")
    assert_heads(xv[0], ours.W_V, ours.b_V, split_heads(v, s.n_kv_heads, s.v_head), f"layer {i} V")
    z = split_heads(xo[0], s.n_heads, s.v_head)  # (B, T, H*dv) -> (B, T, H, dv)
    assert_close(output_proj(z, ours.W_O, ours.b_O), o, f"layer {i} O")
    if qk:
        check_qk_norm(ours, "q", rec[4][0][2], eps_of(mods[4]), xq[0])
        check_qk_norm(ours, "k", rec[5][0][2], eps_of(mods[5]), xk[0])
    if not has_norm:
        assert ours.norm_q is None
        return
    (y,), _, y_out = rec[-1][0]
    assert ours.norm_q is not None and ours.norm_kv is ours.norm_q
    assert_close(apply_norm(ours.norm_q, y, eps_of(mods[-1])), y_out, f"layer {i} norm")


def eps_of(module) -> float:
    return getattr(module, "variance_epsilon", None) or getattr(module, "eps", None) or 1e-5


def check_qk_norm(ours, which: str, out, eps: float, x) -> None:
    """Rebuild the model's q- (or k-) normed states from W, b and the norm's gains (and biases, for LayerNorm)."""
    s, extra = ours.spec, ours.extra
    W, b = getattr(ours, f"W_{which.upper()}"), getattr(ours, f"b_{which.upper()}")
    gain = getattr(ours, f"{which}_norm")
    n = s.n_heads if which == "q" else s.n_kv_heads
    y = per_head(x.double(), W.double(), None if b is None else b.double())  # (B, T, n, d)
    dims = (-2, -1) if extra["qk_norm_scope"] == "projection" else (-1,)
    if extra["qk_norm_kind"] == "layernorm":
        y = y - y.mean(dims, keepdim=True)
    y = y / torch.sqrt(y.pow(2).mean(dims, keepdim=True) + eps) * gain.double()
    beta = extra.get(f"{which}_norm_bias")
    y = y if beta is None else y + beta.double()
    if out.shape[:2] != x.shape[:2]:  # Gemma3 normalises after moving heads forward: (B, n, T, d)
        out = out.transpose(1, 2)  # (B, n, T, d) -> (B, T, n, d)
    assert_close(y, out.reshape(*x.shape[:2], n, s.d_head), f"layer {ours.layer} {which}-norm")


def run_ids(model):
    ids = torch.randint(0, V, (2, 7), generator=torch.Generator().manual_seed(1))
    return model(ids)


def reproduced_layers(case: Case, tmp_path, run=run_ids):
    """Build the case's model, load it through qkinspect (the block's recorded fields as the case expects), run the
    model once capturing every layer's projections, and check each layer's canonical matrices against them.
    Yields (layer index, our AttentionLayer, the layer's watched modules, their records) for further checks."""
    model, path = build(case, tmp_path)
    layers = load_layers(path)
    assert [(a.block, a.layer) for a in layers] == [("decoder", i) for i in range(L)]
    with open_model(path) as m:
        block = m.info.blocks[0]
    for key, want in case.expect.items():
        assert getattr(block, key) == want, key
    blocks = get_attr(model, case.layers)
    mods = [watched(case, blocks, i) for i in range(L)]
    with capture(*(m for ms in mods for m in ms)) as rec, torch.no_grad():
        run(model)
    at = 0
    for i, ours in enumerate(layers):
        n = len(mods[i])
        check_layer(ours, rec[at:at + n], mods[i], norm_module(case, blocks, i) is not None, case.qk is not None)
        yield i, ours, mods[i], rec[at:at + n]
        at += n


@pytest.mark.parametrize("name", sorted(CASES))
def test_split_projections_reproduce_model(name, tmp_path):
    for _ in reproduced_layers(CASES[name], tmp_path):
        pass


def test_model_type_recorded(tmp_path):
    _, path = build(CASES["llama"], tmp_path)
    with open_model(path) as m:
        assert m.info.model_type == "llama"
        assert m.info.blocks[0].flags() == ["gqa"]


@pytest.mark.parametrize("name, kinds", [("gemma2", ["sliding", "full"]), ("gpt_neo", ["full", "local"]),
                                         ("mistral", ["sliding", "sliding"]), ("llama", ["full", "full"])])
def test_per_layer_attention_kind(name, kinds, tmp_path):
    """Where layers of a block differ, each layer's spec carries its own kind; the block keeps the summary."""
    _, path = build(CASES[name], tmp_path)
    with open_model(path) as m:
        got = [a.spec.attention_kind for a in m.layers()]
        summary = m.info.blocks[0].attention_kind
    assert got == kinds
    assert summary == "+".join(sorted(set(kinds)))
