"""Per model_type: what transformers 5's config class makes of each config.json field an adapter reads.

Each family maps attribute names to rules (`config_rules`): a plain field and its class default, an attribute_map
alias, a value ``__post_init__`` derives, or a sub-config. A name a family does not list is read from the real
transformers config. `DEFER_KEYS` are JSON keys after which only transformers knows the result (an alias key set in
the JSON overrides its target after ``__post_init__``; n_embed and text_config_dict are legacy spellings).

Every entry is checked against transformers in tests/loading/test_config.py: class defaults, attribute maps, and
the values of every listed name for saved, default and legacy configs of every family.
"""

from __future__ import annotations

from typing import Any

from qkinspect.loading.config_rules import (
    Alias,
    Derived,
    Field,
    Nested,
    NestedRope,
    OrElse,
    Popped,
    Rope,
    absent,
    every_other,
    falcon_head_dim,
    gemma3_pattern,
    gemma3_window,
    heads,
    layer_types,
    modernbert_pattern,
    neo_attention_layers,
    other,
    pos_att_types,
    quotient,
    qwen2_moe_pattern,
    qwen_pattern,
    window,
)

Rules = dict[str, Any]
INT, BOOL, FLOAT, STRS = "int", "bool", "float", "strs"
# RoPE types the standard conversion keeps as given, in classes without an original_max_position_embeddings field
# (Phi-3 has one, which overwrites the RoPE dict's)
LLAMA3 = ("default", "llama3")


def sizes(hidden: int, heads_: int, layers: int) -> Rules:
    """The three sizes every encoder and decoder has, with the class defaults."""
    return {"hidden_size": Field(INT, hidden), "num_attention_heads": Field(INT, heads_),
            "num_hidden_layers": Field(INT, layers)}


def aliases(**names: str) -> Rules:
    return {name: Alias(target) for name, target in names.items()}


def bert(hidden: int = 768, heads_: int = 12, layers: int = 12, **more: Any) -> Rules:
    return {**sizes(hidden, heads_, layers), "embedding_size": absent(INT), "position_embedding_type": absent(),
            **more}


def decoder(hidden: int, heads_: int, layers: int, kv: Any, head_dim: Any, rope: Any = None, **more: Any) -> Rules:
    """A Llama-style decoder: sizes, key/value heads, head_dim, RoPE, and the sliding-window fields it reads.
    `kv` / `head_dim` are rules; `rope` None is the standard conversion (rope_theta, partial_rotary_factor)."""
    return {**sizes(hidden, heads_, layers), "num_key_value_heads": kv, "head_dim": head_dim,
            "rope_parameters": rope or Rope(types=LLAMA3), "partial_rotary_factor": Popped(),
            "layer_types": layer_types(None), "sliding_window": absent(), "use_sliding_window": absent(), **more}


def mla(hidden: int, heads_: int, layers: int, v_head: Any, **more: Any) -> Rules:
    """DeepSeek's Multi-head Latent Attention: the latent ranks and head widths; head_dim is qk_rope_head_dim
    (``__post_init__``: the rotary width, which RoPE's validation reads)."""
    return {**sizes(hidden, heads_, layers), "q_lora_rank": Field(INT, 1536, nullable=True),
            "kv_lora_rank": Field(INT, 512), "qk_nope_head_dim": Field(INT, 128), "qk_rope_head_dim": Field(INT, 64),
            "v_head_dim": v_head, "head_dim": Derived(other("qk_rope_head_dim")), "rope_parameters": Rope(), **more}


def without(rules: Rules, *names: str) -> Rules:
    return {k: v for k, v in rules.items() if k not in names}


def qwen(hidden: int, heads_: int, layers: int, kv: Any, head_dim: Any, off: Any, pattern: Any) -> Rules:
    return decoder(hidden, heads_, layers, kv, head_dim, sliding_window=Derived(window(off)),
                   use_sliding_window=Field(BOOL, False), max_window_layers=Field(INT, 28),
                   layer_types=layer_types(pattern))


def gemma2(hidden: int, heads_: int, layers: int, softcap: float | None, **more: Any) -> Rules:
    fields = {"sliding_window": Field(INT, 4096, nullable=True), "layer_types": layer_types(every_other),
              "query_pre_attn_scalar": Field(INT, 256),
              "attn_logit_softcapping": Field(FLOAT, softcap, nullable=True)}
    return decoder(hidden, heads_, layers, Field(INT, 4), Field(INT, 256), **{**fields, **more})


def t5(heads_: int, layers: int) -> Rules:
    return {"d_model": Field(INT, 512), "num_heads": Field(INT, heads_), "num_layers": Field(INT, layers),
            "d_kv": Field(INT, 64), "num_decoder_layers": OrElse(INT, None, other("num_layers")),
            **aliases(hidden_size="d_model", num_attention_heads="num_heads", num_hidden_layers="num_layers",
                      head_dim="d_kv")}


def seq2seq(d_model: int, heads_: int, layers: int, nullable: bool = False, **more: str) -> Rules:
    f = {name: Field(INT, v, nullable=nullable) for name, v in (
        ("d_model", d_model), ("encoder_attention_heads", heads_), ("decoder_attention_heads", heads_),
        ("encoder_layers", layers), ("decoder_layers", layers))}
    return {**f, **aliases(hidden_size="d_model", num_attention_heads="encoder_attention_heads",
                           num_hidden_layers="encoder_layers", **more)}


OR_HEADS = OrElse(INT, None, heads)
OR_QUOTIENT = OrElse(INT, None, quotient)
NO_HEAD_DIM = {"head_dim": absent(), "num_key_value_heads": absent()}
GPT2_NAMES = aliases(hidden_size="n_embd", max_position_embeddings="n_positions", num_attention_heads="n_head",
                     num_hidden_layers="n_layer")

FAMILIES: dict[str, Rules] = {
    # encoders
    "bert": bert(), "roberta": bert(), "xlm-roberta": bert(), "camembert": bert(),
    "electra": bert(256, 4, 12, embedding_size=Field(INT, 128)),
    "distilbert": {"dim": Field(INT, 768), "n_heads": Field(INT, 12), "n_layers": Field(INT, 6),
                   **aliases(hidden_size="dim", num_attention_heads="n_heads", num_hidden_layers="n_layers")},
    "albert": {**sizes(4096, 64, 12), "embedding_size": Field(INT, 128), "inner_group_num": Field(INT, 1),
               "num_hidden_groups": Field(INT, 1)},
    "deberta-v2": {**sizes(1536, 24, 24), "attention_head_size": absent(), "conv_kernel_size": absent(),
                   "pos_att_type": Field(STRS, None, nullable=True), "relative_attention": Field(BOOL, False)},
    "deberta": {**sizes(768, 12, 12), "pos_att_type": Derived(pos_att_types),
                "relative_attention": Field(BOOL, False), "talking_head": absent(BOOL)},
    "mpnet": sizes(768, 12, 12), "vit": sizes(768, 12, 12), "deit": sizes(768, 12, 12),
    "clip": {"text_config": Nested("clip_text_model"), "vision_config": Nested("clip_vision_model")},
    "clip_text_model": sizes(512, 8, 12), "clip_vision_model": sizes(768, 12, 12),
    "siglip": {"text_config": Nested("siglip_text_model"), "vision_config": Nested("siglip_vision_model")},
    "siglip_text_model": sizes(768, 12, 12),
    "siglip_vision_model": {**sizes(768, 12, 12), "vision_use_head": Field(BOOL, True)},
    "reformer": {"hidden_size": Field(INT, 256), "num_attention_heads": Field(INT, 12),
                 "attention_head_size": Field(INT, 64),
                 "attn_layers": Field(STRS, ("local", "lsh", "local", "lsh", "local", "lsh"))},
    "modernbert": {**sizes(768, 12, 22), "local_attention": Field(INT, 128), "head_dim": absent(),
                   "layer_types": layer_types(modernbert_pattern),
                   "rope_parameters": NestedRope(full=("global_rope_theta", 160000.0),
                                                 sliding=("local_rope_theta", 10000.0), legacy=("rope_theta",))},
    # encoder-decoders
    "t5": t5(8, 6), "mt5": t5(6, 8), "umt5": t5(6, 8),
    "bart": seq2seq(1024, 16, 12, nullable=True), "marian": seq2seq(1024, 16, 12),
    "whisper": seq2seq(384, 6, 4, num_key_value_heads="encoder_attention_heads"),
    "mbart": seq2seq(1024, 16, 12), "pegasus": seq2seq(1024, 16, 12),
    # decoders with separate projections
    "llama": decoder(4096, 32, 32, OR_HEADS, OR_QUOTIENT),
    "mistral": decoder(4096, 32, 32, OrElse(INT, 8, heads), OR_QUOTIENT,
                       sliding_window=Field(INT, 4096, nullable=True)),
    "mixtral": decoder(4096, 32, 32, OrElse(INT, 8, heads), Field(INT, None, nullable=True),  # no head_dim default
                       Rope(theta=("rope_theta", 1e6), types=LLAMA3),
                       sliding_window=Field(INT, None, nullable=True), **aliases(num_experts="num_local_experts")),
    "qwen2": qwen(4096, 32, 32, OrElse(INT, 32, heads), absent(), None, qwen_pattern),
    "qwen2_moe": qwen(2048, 16, 24, Field(INT, 16, nullable=True), absent(), 0, qwen2_moe_pattern),
    "qwen3": qwen(4096, 32, 32, OrElse(INT, 32, heads), Field(INT, 128), None, qwen_pattern),
    "qwen3_moe": {**without(qwen(2048, 32, 24, Field(INT, 4), absent(), None, None), "max_window_layers"),
                  **aliases(num_experts="num_local_experts")},
    "gemma": decoder(3072, 16, 28, Field(INT, 16), Field(INT, 256)),
    "gemma2": gemma2(2304, 8, 26, 50.0),
    "gemma3_text": gemma2(2304, 8, 26, None, sliding_window=Derived(gemma3_window),
                          layer_types=layer_types(gemma3_pattern),
                          rope_parameters=NestedRope(full=("rope_theta", 1e6), sliding=("rope_local_base_freq", 1e4),
                                                     legacy=("partial_rotary_factor",)),
                          partial_rotary_factor=absent()),  # not consumed by Gemma3's own RoPE conversion
    "olmo2": decoder(4096, 32, 32, OR_HEADS, absent()),
    "phi": decoder(2048, 32, 24, OR_HEADS, absent(), Rope(partial=("partial_rotary_factor", 0.5), types=LLAMA3),
                   qk_layernorm=Field(BOOL, False)),
    "starcoder2": decoder(3072, 24, 30, Field(INT, 2), absent(), sliding_window=Field(INT, None, nullable=True)),
    "stablelm": decoder(2560, 32, 32, Field(INT, 32), absent(),
                        Rope(partial=("partial_rotary_factor", 0.25), types=LLAMA3), qk_layernorm=Field(BOOL, False)),
    "granite": decoder(4096, 32, 32, OR_HEADS, absent(), attention_multiplier=Field("num", 1.0)),
    "cohere": decoder(8192, 64, 40, OR_HEADS, absent(), Rope(theta=("rope_theta", 500000.0), types=LLAMA3),
                      use_qk_norm=Field(BOOL, False, nullable=True)),
    "deepseek_v2": mla(4096, 32, 32, Field(INT, 128), **aliases(num_experts="n_routed_experts")),
    "deepseek_v3": mla(7168, 128, 61, Field(INT, 128, nullable=True), rope_interleave=Field(BOOL, True, nullable=True),
                       **aliases(num_local_experts="n_routed_experts", num_mtp_layers="num_nextn_predict_layers")),
    "opt": {**sizes(768, 12, 12), **NO_HEAD_DIM, "do_layer_norm_before": Field(BOOL, True),
            "layer_types": layer_types(None)},
    "gpt_neo": {"hidden_size": Field(INT, 2048), "num_heads": Field(INT, 16), "num_layers": Field(INT, 24),
                "window_size": Field(INT, 256), "attention_layers": Derived(neo_attention_layers), **NO_HEAD_DIM,
                **aliases(num_attention_heads="num_heads", num_hidden_layers="num_layers")},
    "gptj": {"n_embd": Field(INT, 4096), "n_head": Field(INT, 16), "n_layer": Field(INT, 28),
             "rotary_dim": Field(INT, 64), "layer_types": layer_types(None), **NO_HEAD_DIM, **GPT2_NAMES},
    # decoders with fused projections
    "gpt2": {"n_embd": Field(INT, 768), "n_head": Field(INT, 12), "n_layer": Field(INT, 12),
             "scale_attn_weights": Field(BOOL, True), "scale_attn_by_inverse_layer_idx": Field(BOOL, False),
             "add_cross_attention": Field(BOOL, False), **NO_HEAD_DIM, **GPT2_NAMES},
    "gpt_neox": {**sizes(6144, 64, 44), **NO_HEAD_DIM,
                 "rope_parameters": Rope(theta=("rotary_emb_base", 10000.0), partial=("rotary_pct", 0.25),
                                         legacy=("rope_scaling", "rotary_emb_base", "rotary_pct", "rope_theta",
                                                 "partial_rotary_factor"))},
    "bloom": {"hidden_size": Field(INT, 64), "n_head": Field(INT, 8), "n_layer": Field(INT, 2), **NO_HEAD_DIM,
              **aliases(num_attention_heads="n_head", num_hidden_layers="n_layer")},
    "falcon": {**sizes(4544, 71, 32), "head_dim": Derived(falcon_head_dim), "num_kv_heads": OR_HEADS,
               **{name: Field(BOOL, v, nullable=True) for name, v in (
                   ("multi_query", True), ("new_decoder_architecture", False), ("alibi", False),
                   ("parallel_attn", True))},
               "num_ln_in_parallel_attn": Field(INT, None, nullable=True)},
    "mpt": {"d_model": Field(INT, 2048), "n_heads": Field(INT, 16), "n_layers": Field(INT, 24), **NO_HEAD_DIM,
            "attn_config": Nested("mpt_attention"),
            **aliases(hidden_size="d_model", num_attention_heads="n_heads", num_hidden_layers="n_layers")},
    "mpt_attention": {"alibi": Field(BOOL, True), "clip_qkv": Field(FLOAT, None, nullable=True),
                      "softmax_scale": Field(FLOAT, None, nullable=True)},
    "phi3": decoder(3072, 32, 32, OR_HEADS, absent(), Rope(partial=("partial_rotary_factor", 1.0)),
                    sliding_window=Field(INT, None, nullable=True),
                    partial_rotary_factor=absent()),  # Phi-3 reads it without consuming it
}

for _rules in FAMILIES.values():  # PreTrainedConfig's own field, read by the loader for every model
    _rules.setdefault("architectures", Field(STRS, None, nullable=True))

# Sub-configs: their class's model_type ("" for MPT's attention config, which has none of its own).
SUB_MODEL_TYPES = {"clip_text_model": "clip_text_model", "clip_vision_model": "clip_vision_model",
                   "siglip_text_model": "siglip_text_model", "siglip_vision_model": "siglip_vision_model",
                   "mpt_attention": ""}

DEFER_KEYS: dict[str, tuple[str, ...]] = {
    "bloom": ("n_embed",), "falcon": ("n_embed", "head_dim", "rotary"), "modernbert": ("sliding_window",),
    "clip": ("text_config_dict", "vision_config_dict"),
}
# Keys any config class treats specially: per-layer (heterogeneous) configs change what the global attributes
# mean; the rest are read-only properties or class attributes a JSON key would shadow.
GLOBAL_DEFER_KEYS = ("per_layer_config", "per_layer_attributes", "allow_global_per_layer_attribute_access",
                     "serialize_explicit_per_layer_config", "is_heterogeneous", "_heterogeneity_spec",
                     "use_return_dict", "attribute_map", "sub_configs", "sub_configs_defaults")


def defer_keys(family: str) -> set[str]:
    """JSON keys whose presence leaves the whole config to transformers: the family's alias names (set after
    ``__post_init__``, they override their target and whatever was derived from it), its legacy spellings and
    properties, and the keys every config class treats specially."""
    rules = FAMILIES[family]
    aliased = {n for n, r in rules.items() if isinstance(r, Alias)}
    return aliased | set(DEFER_KEYS.get(family, ())) | set(GLOBAL_DEFER_KEYS)
