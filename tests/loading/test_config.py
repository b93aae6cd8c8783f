"""The light config reader gives, for every supported model_type, the values transformers' AutoConfig gives.

For each family: configs saved by transformers (the adapter suites' tiny models), a config.json holding only the
model_type (every default), and configs in the forms found on the hub (legacy RoPE keys, nulls, aliases ...).
Every attribute the family's rules list, and every attribute its adapter reads (recorded, misses included), must
come out equal, types included, or missing on both sides; the adapter must build the same blocks and per-layer
records from either; and for the forms the rules model, transformers must not have been needed at all.
"""

from __future__ import annotations

import doctest
import json
import math
import subprocess
import sys
from typing import Any

import pytest
import transformers as tf
from transformers import AutoConfig, PreTrainedConfig

from qkinspect.errors import CheckpointError
from qkinspect.loading import adapter_for, config, open_model, supported_model_types
from qkinspect.loading.config import LightConfig, read_config
from qkinspect.loading.config_families import FAMILIES, SUB_MODEL_TYPES
from qkinspect.loading.config_rules import Alias, Nested
from tests.adapters import (
    test_dec_fused,
    test_dec_gpt2_cross,
    test_dec_mla,
    test_dec_probs,
    test_decoders,
    test_enc_deberta,
    test_more_decoders,
    test_more_encoders,
    test_more_seq2seq,
)
from tests.adapters.test_enc_seq2seq import BART_SMALL, T5_SMALL
from tests.adapters.test_encoders import SMALL
from tests.loading import tiny

# -- the configs ------------------------------------------------------------------------------------------------

LLAMA3_SCALING = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192,
                      rope_type="llama3")
IMG = dict(image_size=16, patch_size=8)
SAVED: dict[str, PreTrainedConfig] = {
    **{f"dec-{n}": c.config for n, c in test_decoders.CASES.items()},
    **{f"fused-{n}": c.config for n, c in test_dec_fused.CASES.items()},
    **{f"probs-{n}": c.config for n, c in test_dec_probs.CASES.items()},
    "bert": tf.BertConfig(**SMALL), "roberta": tf.RobertaConfig(**SMALL, pad_token_id=1),
    "xlm-roberta": tf.XLMRobertaConfig(**SMALL), "camembert": tf.CamembertConfig(**SMALL),
    "electra": tf.ElectraConfig(**SMALL, embedding_size=32),
    "distilbert": tf.DistilBertConfig(dim=64, n_layers=2, n_heads=4, hidden_dim=64, vocab_size=99),
    "albert": tf.AlbertConfig(**SMALL, embedding_size=32, num_hidden_groups=2, inner_group_num=2),
    "deberta-v3": tf.DebertaV2Config(**SMALL, relative_attention=True, pos_att_type=["p2c", "c2p"],
                                     conv_kernel_size=3, attention_head_size=8),
    "deberta-v2-plain": tf.DebertaV2Config(**SMALL),
    "mpnet": tf.MPNetConfig(**SMALL), "vit": tf.ViTConfig(**SMALL, **IMG), "deit": tf.DeiTConfig(**SMALL, **IMG),
    "clip": tf.CLIPConfig(text_config=dict(SMALL), vision_config=dict(**{**SMALL, "hidden_size": 48}, **IMG)),
    "clip_text_model": tf.CLIPTextConfig(**SMALL), "clip_vision_model": tf.CLIPVisionConfig(**SMALL, **IMG),
    "modernbert": tf.ModernBertConfig(hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                                      global_attn_every_n_layers=2, local_attention=16),
    "reformer": tf.ReformerConfig(hidden_size=64, num_attention_heads=4, attention_head_size=8,
                                  attn_layers=["local", "lsh", "local"], axial_pos_shape=[4, 4],
                                  axial_pos_embds_dim=[32, 32], max_position_embeddings=16),
    "t5": tf.T5Config(**T5_SMALL), "mt5": tf.MT5Config(**T5_SMALL), "umt5": tf.UMT5Config(**T5_SMALL),
    "t5-encoder": tf.T5Config(**T5_SMALL, architectures=["T5EncoderModel"]),
    "llama-3.1-saved": tf.LlamaConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
                                      rope_parameters={**LLAMA3_SCALING, "rope_theta": 5e5}),
    "bart": tf.BartConfig(**BART_SMALL), "marian": tf.MarianConfig(**BART_SMALL),
    "whisper": tf.WhisperConfig(**BART_SMALL, num_mel_bins=8),
    **{f"more-{n}": c for n, c in test_more_seq2seq.CONFIGS.items()},
    **{f"more-{n}": c for n, c in test_more_encoders.CONFIGS.items()},
    **{f"more-{n}": c for n, c in test_more_decoders.CONFIGS.items()},
    **{f"enc-{n}": c for n, c in test_enc_deberta.CONFIGS.items()},
    **{f"dec-{n}": c for n, c in test_dec_gpt2_cross.CONFIGS.items()},
    **{f"mla-{n}": c for n, c in test_dec_mla.CONFIGS.items() if "yarn" not in n},
}

LLAMA2 = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=4096, intermediate_size=11008,
              num_attention_heads=32, num_hidden_layers=32, num_key_value_heads=32, rope_theta=10000.0,
              rope_scaling=None, rms_norm_eps=1e-5, torch_dtype="float16", max_position_embeddings=4096)
QWEN2 = dict(model_type="qwen2", hidden_size=896, num_attention_heads=14, num_key_value_heads=2, num_hidden_layers=24,
             max_window_layers=21, rope_theta=1000000.0, sliding_window=32768, use_sliding_window=False)
GEMMA3 = dict(model_type="gemma3_text", hidden_size=1152, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
              num_hidden_layers=26, query_pre_attn_scalar=256, rope_theta=1000000.0, rope_local_base_freq=10000.0,
              sliding_window=512, sliding_window_pattern=6, rope_scaling=None)
CLIP_TOWERS = dict(text_config=dict(hidden_size=512, num_attention_heads=8, num_hidden_layers=12),
                   vision_config=dict(hidden_size=768, num_attention_heads=12, num_hidden_layers=12, patch_size=32))

# config.json as found on the hub, in older forms; value: (json, whether the light rules answer it alone)
HUB: dict[str, tuple[dict, bool]] = {
    "llama-2": (LLAMA2, True),
    "llama-nulls": ({**LLAMA2, "num_key_value_heads": None, "head_dim": None, "rope_theta": 500000}, True),
    "llama-partial-rope": ({**LLAMA2, "partial_rotary_factor": 0.5}, True),
    "llama-3.1": ({**LLAMA2, "num_key_value_heads": 8, "rope_theta": 500000.0, "rope_scaling": LLAMA3_SCALING},
                  True),
    "llama-3.1-v5": ({**LLAMA2, "rope_theta": None, "rope_parameters": {**LLAMA3_SCALING, "rope_theta": 5e5}}, False),
    "llama-3.1-missing-key": ({**LLAMA2, "rope_scaling": {**LLAMA3_SCALING, "low_freq_factor": None}}, False),
    "llama-linear-type-key": ({**LLAMA2, "rope_scaling": {"type": "linear", "factor": 2.0}}, False),
    "qwen2-yarn": ({**QWEN2, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                              "original_max_position_embeddings": 32768}}, False),
    "llama-layer-types": ({**LLAMA2, "num_hidden_layers": 2, "layer_types": ["full_attention"] * 2}, True),
    "llama-legacy-layer-types": ({**LLAMA2, "num_hidden_layers": 2, "layer_types": ["attention"] * 2}, False),
    "mistral-v0.1": (dict(LLAMA2, model_type="mistral", num_key_value_heads=8, sliding_window=4096), True),
    "mistral-v0.2": (dict(LLAMA2, model_type="mistral", num_key_value_heads=8, sliding_window=None,
                          rope_theta=1000000.0), True),
    "mixtral": (dict(LLAMA2, model_type="mixtral", num_local_experts=8, sliding_window=None), True),
    "mixtral-no-theta": (dict(model_type="mixtral", hidden_size=64, num_attention_heads=4), True),
    "qwen2": (QWEN2, True),
    "qwen2-sliding": ({**QWEN2, "use_sliding_window": True}, True),
    "qwen2-no-window": ({**QWEN2, "use_sliding_window": True, "sliding_window": None}, True),
    "qwen2_moe": ({**QWEN2, "model_type": "qwen2_moe", "use_sliding_window": True, "num_experts": 4}, True),
    "qwen2_moe-off": ({**QWEN2, "model_type": "qwen2_moe", "num_key_value_heads": None}, True),
    "qwen3": ({**QWEN2, "model_type": "qwen3", "head_dim": 128, "sliding_window": None}, True),
    "qwen3_moe": ({**QWEN2, "model_type": "qwen3_moe", "head_dim": 128, "use_sliding_window": True}, True),
    "gemma": (dict(LLAMA2, model_type="gemma", num_key_value_heads=1, head_dim=256, hidden_act="gelu"), True),
    "gemma-null-kv": (dict(LLAMA2, model_type="gemma", num_key_value_heads=None), False),
    "gemma2": (dict(model_type="gemma2", hidden_size=2304, num_attention_heads=8, num_key_value_heads=4,
                    head_dim=256, num_hidden_layers=26, query_pre_attn_scalar=256, sliding_window=4096,
                    attn_logit_softcapping=50.0, final_logit_softcapping=30.0, cache_implementation="hybrid",
                    rope_theta=10000.0), True),
    "gemma2-int-softcap": (dict(model_type="gemma2", attn_logit_softcapping=50), False),
    "gemma3": (GEMMA3, True),
    "gemma3-bidirectional": ({**GEMMA3, "use_bidirectional_attention": True}, True),
    "gemma3-linear-scaling": ({**GEMMA3, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}, False),
    "olmo2": (dict(LLAMA2, model_type="olmo2", rope_theta=500000), True),
    "phi-2": (dict(model_type="phi", hidden_size=2560, num_attention_heads=32, num_hidden_layers=32,
                   partial_rotary_factor=0.4, rope_theta=10000.0, qk_layernorm=False, rope_scaling=None), True),
    "phi-3-mini": (dict(model_type="phi3", hidden_size=3072, num_attention_heads=32, num_hidden_layers=32,
                        num_key_value_heads=32, rope_theta=10000.0, rope_scaling=None, sliding_window=2047,
                        original_max_position_embeddings=4096), True),
    "phi-3-partial": (dict(model_type="phi3", hidden_size=64, num_attention_heads=4, partial_rotary_factor=0.5),
                      True),
    "pythia": (dict(model_type="gpt_neox", hidden_size=512, num_attention_heads=8, num_hidden_layers=6,
                    rotary_pct=0.25, rotary_emb_base=10000, use_parallel_residual=True), True),
    "neox-rope-theta": (dict(model_type="gpt_neox", hidden_size=512, num_attention_heads=8, rope_theta=5e5), False),
    "gpt2": (dict(model_type="gpt2", n_embd=768, n_head=12, n_layer=12, n_ctx=1024, n_positions=1024), True),
    "gpt2-alias-key": (dict(model_type="gpt2", n_embd=768, hidden_size=64), False),
    "gpt2-cross": (dict(model_type="gpt2", n_embd=768, n_head=12, n_layer=12, add_cross_attention=True), True),
    "gpt2-cross-null": (dict(model_type="gpt2", add_cross_attention=None), False),
    "gpt-j": (dict(model_type="gptj", n_embd=4096, n_head=16, n_layer=28, rotary_dim=64), True),
    "gpt-neo": (dict(model_type="gpt_neo", hidden_size=768, num_heads=12, num_layers=4, window_size=256,
                     attention_types=[[["global", "local"], 2]]), True),
    "gpt-neo-bad-types": (dict(model_type="gpt_neo", num_layers=3, attention_types=[[["global", "local"], 2]]),
                          False),
    "starcoder2-3b": (dict(model_type="starcoder2", hidden_size=3072, num_attention_heads=24, num_key_value_heads=2,
                           num_hidden_layers=30, rope_theta=999999.4420358813, sliding_window=4096, use_bias=True,
                           norm_epsilon=1e-5), True),
    "stablelm-2-1_6b": (dict(model_type="stablelm", hidden_size=2048, num_attention_heads=32, num_key_value_heads=32,
                             num_hidden_layers=24, partial_rotary_factor=0.25, rope_theta=10000, use_qkv_bias=True,
                             qk_layernorm=False, use_parallel_residual=False), True),
    "stablelm-2-12b": (dict(model_type="stablelm", hidden_size=5120, num_attention_heads=32, num_key_value_heads=8,
                            num_hidden_layers=40, partial_rotary_factor=0.25, rope_theta=10000, qk_layernorm=True,
                            use_parallel_residual=True), True),
    "stablelm-no-partial": (dict(model_type="stablelm", hidden_size=64, num_attention_heads=4), True),
    "granite-3.0-2b": (dict(model_type="granite", hidden_size=2048, num_attention_heads=32, num_key_value_heads=8,
                            num_hidden_layers=40, attention_multiplier=0.015625, embedding_multiplier=12.0,
                            residual_multiplier=0.22, logits_scaling=8.0, rope_theta=10000.0,
                            attention_bias=False), True),
    "granite-int-multiplier": (dict(model_type="granite", attention_multiplier=1), True),
    "command-r": (dict(model_type="cohere", hidden_size=8192, num_attention_heads=64, num_key_value_heads=64,
                       num_hidden_layers=40, rope_theta=8000000.0, use_qk_norm=False, logit_scale=0.0625), True),
    "command-r-plus": (dict(model_type="cohere", hidden_size=12288, num_attention_heads=96, num_key_value_heads=8,
                            num_hidden_layers=64, rope_theta=75000000.0, use_qk_norm=True), True),
    "cohere-default-theta": (dict(model_type="cohere", hidden_size=64, num_attention_heads=4), True),
    "opt-350m": (dict(model_type="opt", hidden_size=1024, num_attention_heads=16, num_hidden_layers=24,
                      do_layer_norm_before=False, word_embed_proj_dim=512), True),
    "bloom-560m": (dict(model_type="bloom", n_embed=1024, n_head=16, n_layer=24), False),
    "falcon-7b": (dict(model_type="falcon", hidden_size=4544, num_attention_heads=71, num_hidden_layers=32,
                       multi_query=True, new_decoder_architecture=False, alibi=False, parallel_attn=True), True),
    "falcon-40b": (dict(model_type="falcon", hidden_size=8192, num_attention_heads=128, num_hidden_layers=60,
                        new_decoder_architecture=True, num_kv_heads=8, num_ln_in_parallel_attn=None), True),
    "mpt-7b": (dict(model_type="mpt", d_model=4096, n_heads=32, n_layers=32, expansion_ratio=4,
                    attn_config=dict(alibi=True, attn_impl="torch", clip_qkv=None, softmax_scale=None,
                                     attn_pdrop=0, qk_ln=False)), True),
    "mpt-clip": (dict(model_type="mpt", attn_config=dict(clip_qkv=6.0, alibi=False)), True),
    "mpt-int-clip": (dict(model_type="mpt", attn_config=dict(clip_qkv=6)), False),
    "bert-demo-style": (dict(model_type="bert", hidden_size=384, num_attention_heads=12, num_hidden_layers=6,
                             position_embedding_type="absolute", gradient_checkpointing=False), True),
    "bert-string-size": (dict(model_type="bert", hidden_size="384"), False),
    "roberta-relative": (dict(model_type="roberta", position_embedding_type="relative_key"), True),
    "distilbert": (dict(model_type="distilbert", dim=768, n_heads=12, n_layers=6, sinusoidal_pos_embds=False), True),
    "albert-base-v2": (dict(model_type="albert", hidden_size=768, num_attention_heads=12, embedding_size=128,
                            num_hidden_groups=1, inner_group_num=1), True),
    "deberta-v3": (dict(model_type="deberta-v2", relative_attention=True, pos_att_type=["p2c", "c2p"],
                        position_buckets=256, share_att_key=True), True),
    "deberta-v2-legacy": (dict(model_type="deberta-v2", pos_att_type="p2c|c2p", conv_kernel_size=3), False),
    "deberta-base": (dict(model_type="deberta", hidden_size=768, num_attention_heads=12, num_hidden_layers=12,
                          relative_attention=True, max_relative_positions=-1, position_biased_input=False,
                          pos_att_type=["c2p", "p2c"], layer_norm_eps=1e-7), True),
    "deberta-base-hub": (dict(model_type="deberta", relative_attention=True, pos_att_type="c2p|p2c"), True),
    "deberta-spaced": (dict(model_type="deberta", pos_att_type=" P2C | c2p"), True),
    "deberta-int-types": (dict(model_type="deberta", pos_att_type=[1, 2]), False),
    "deberta-talking": (dict(model_type="deberta", talking_head=True), True),
    "clip": (dict(model_type="clip", **CLIP_TOWERS), True),
    "clip-config-dict": (dict(model_type="clip", text_config_dict=dict(hidden_size=256), **CLIP_TOWERS), False),
    "t5-small": (dict(model_type="t5", d_model=512, num_heads=8, num_layers=6, d_kv=64, feed_forward_proj="relu"),
                 True),
    "flan-t5": (dict(model_type="t5", num_decoder_layers=12, num_layers=12, feed_forward_proj="gated-gelu"), True),
    "t5-bad-activation": (dict(model_type="t5", feed_forward_proj="gated-gelu-x"), False),
    "bart-large": (dict(model_type="bart", d_model=1024, encoder_layers=12, num_hidden_layers=12), False),
    "whisper-tiny": (dict(model_type="whisper", d_model=384, encoder_layers=4, decoder_layers=4,
                          encoder_attention_heads=6, decoder_attention_heads=6), True),
    "mbart-large-50": (dict(model_type="mbart", d_model=1024, encoder_layers=12, decoder_layers=12,
                            encoder_attention_heads=16, decoder_attention_heads=16, scale_embedding=True), True),
    "pegasus-large": (dict(model_type="pegasus", d_model=1024, encoder_layers=16, decoder_layers=16,
                           encoder_attention_heads=16, decoder_attention_heads=16, static_position_embeddings=True),
                      True),
    "siglip-base": (dict(model_type="siglip", text_config=dict(hidden_size=768, num_attention_heads=12,
                                                               num_hidden_layers=12, vocab_size=32000),
                         vision_config=dict(hidden_size=768, num_attention_heads=12, num_hidden_layers=12,
                                            patch_size=16, image_size=224)), True),
    "siglip-wide-no-head": (dict(model_type="siglip", text_config=dict(hidden_size=1152, num_attention_heads=16),
                                 vision_config=dict(hidden_size=1152, num_attention_heads=16, vision_use_head=False)),
                            True),
    "siglip-vision": (dict(model_type="siglip_vision_model", hidden_size=768, num_attention_heads=12), True),
    "modernbert-base": (dict(model_type="modernbert", hidden_size=768, num_attention_heads=12, num_hidden_layers=22,
                             global_rope_theta=160000.0, local_rope_theta=10000.0, global_attn_every_n_layers=3,
                             local_attention=128), True),
    "reformer": (dict(model_type="reformer", attn_layers=["local", "lsh"], attention_head_size=64), True),
    "special-float": (dict(LLAMA2, rope_theta={"__float__": "Infinity"}), False),
    "per-layer-null": (dict(LLAMA2, per_layer_config=None), False),
    "modernbert-window-key": (dict(model_type="modernbert", local_attention=128, sliding_window=32), False),
}
DEEPSEEK_V3 = dict(model_type="deepseek_v3", hidden_size=7168, num_attention_heads=128, num_key_value_heads=128,
                   num_hidden_layers=61, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                   v_head_dim=128, n_routed_experts=256, num_nextn_predict_layers=1, first_k_dense_replace=3,
                   rope_theta=10000, max_position_embeddings=163840,
                   rope_scaling=dict(type="yarn", factor=40, beta_fast=32, beta_slow=1, mscale=1.0,
                                     mscale_all_dim=1.0, original_max_position_embeddings=4096))
DEEPSEEK_V2_LITE = dict(model_type="deepseek_v2", hidden_size=2048, num_attention_heads=16, num_key_value_heads=16,
                        num_hidden_layers=27, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128,
                        qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=64, rope_theta=10000, rope_scaling=None)
HUB.update({
    "deepseek-v3-yarn": (DEEPSEEK_V3, False),  # YaRN is left to transformers
    "deepseek-v3-plain-rope": ({**DEEPSEEK_V3, "rope_scaling": None, "rope_interleave": False}, True),
    "deepseek-v2-lite": (DEEPSEEK_V2_LITE, True),
    "deepseek-v2-indivisible": ({**DEEPSEEK_V2_LITE, "hidden_size": 2050}, False),
    "deepseek-v2-alias-key": ({**DEEPSEEK_V2_LITE, "num_experts": 8}, False),
})
REFUSED = {"deepseek-v2-indivisible",
           "bert-string-size", "deberta-int-types", "gemma-null-kv", "gemma2-int-softcap", "gpt-neo-bad-types",
           "gpt2-cross-null", "llama-3.1-missing-key", "mpt-int-clip", "t5-bad-activation"}
DEFAULTS = {f"defaults-{mt}": ({"model_type": mt}, True) for mt in supported_model_types()}
# name -> (a config to save, or a config.json's content; whether the light rules answer it alone)
CASES: dict[str, tuple[PreTrainedConfig | dict, bool]] = {
    **{f"saved-{n}": (c, True) for n, c in SAVED.items()}, **{f"hub-{n}": case for n, case in HUB.items()},
    **DEFAULTS, "saved-mla-v3-yarn": (test_dec_mla.CONFIGS["v3-yarn"], False),  # YaRN: left to transformers
}


def write(tmp_path, data: dict | PreTrainedConfig):
    folder = tmp_path / "m"
    folder.mkdir(parents=True)
    if isinstance(data, PreTrainedConfig):
        data.save_pretrained(folder)
    else:
        (folder / "config.json").write_text(json.dumps(data))
    return folder, json.loads((folder / "config.json").read_text())


def both(tmp_path, name: str):
    """(light config, transformers config) for a case, or None where AutoConfig refuses the config, after checking
    that the light reader refuses it too."""
    folder, raw = write(tmp_path, CASES[name][0])
    try:
        real = AutoConfig.from_pretrained(str(folder))
    except Exception:
        with pytest.raises(CheckpointError, match="transformers cannot read this config"):
            read_config(folder, raw)
        return None
    return read_config(folder, raw), real


# -- recording what an adapter reads ----------------------------------------------------------------------------


class Recorder:
    """Wraps a config and records every attribute read through it (misses too), sub-configs as "parent.name"."""

    def __init__(self, config: Any, log: set[str], prefix: str = ""):
        self.__dict__.update(_c=config, _log=log, _p=prefix)

    def __getattr__(self, name: str) -> Any:
        self._log.add(self._p + name)
        value = getattr(self._c, name)
        return Recorder(value, self._log, f"{self._p}{name}.") if is_config(value) else value


def is_config(v: Any) -> bool:
    return isinstance(v, (LightConfig, PreTrainedConfig))


def exercise(config: Any, log: set[str] | None = None) -> list:
    """Everything the model's adapter derives from the config: blocks, and per layer its tensor names, shapes and
    record spec and extras (as the loader asks for them)."""
    a = adapter_for(config.model_type)(config if log is None else Recorder(config, log))
    out: list = [a.blocks()]
    for b in a.blocks():
        for i in range(b.n_layers):
            out += [a.tensor_names(b.key, i), a.optional_names(b.key, i), a.expected_shapes(b.key, i)]
            for method in ("layer_spec", "layer_extra"):
                fn = getattr(a, method, None)
                if fn is not None:
                    out.append(fn(i) if _takes_layer_only(fn) else fn(b.key, i))
    return out


def _takes_layer_only(fn) -> bool:
    return fn.__code__.co_argcount == 2  # (self, layer) in DecoderAdapter and ModernBERT; else (self, block, layer)


def same(a: Any, b: Any) -> bool:
    """Equal values of equal types, recursively (1 is not 1.0, [1] is not (1,)); NaN equals NaN."""
    if is_config(a) or is_config(b):
        return is_config(a) and is_config(b)  # sub-configs: compared attribute by attribute
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def lookup(config: Any, name: str) -> tuple[bool, Any]:
    try:
        return True, getattr(config, name)
    except AttributeError:
        return False, None


def assert_same_attributes(light: Any, real: Any, names: set[str], where: str = "") -> None:
    """Each name (dotted for sub-configs) present on both with the same value, or missing on both."""
    for name in sorted(n for n in names if "." not in n):
        (has_l, vl), (has_r, vr) = lookup(light, name), lookup(real, name)
        assert has_l == has_r, f"{where}{name}: light {'has' if has_l else 'lacks'} it, transformers does not"
        assert same(vl, vr), f"{where}{name}: light {vl!r} != transformers {vr!r}"
        if is_config(vl):
            sub = {n.split(".", 1)[1] for n in names if n.startswith(name + ".")}
            rules = FAMILIES.get(getattr(vl, "family", ""), {})
            assert_same_attributes(vl, vr, sub | set(rules) | {"model_type"}, f"{where}{name}.")


def used_transformers(light: Any) -> list[str]:
    """Names a light config (or its sub-configs) left to transformers."""
    if not isinstance(light, LightConfig):
        return ["<the whole config>"]
    subs = [f"{n}.{d}" for n, s in light._nested.items() for d in used_transformers(s)]
    return sorted(light.deferred) + subs + (["<built>"] if light.used_transformers and not light.deferred else [])


# -- the proofs --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_light_config_reads_what_transformers_reads(name, tmp_path):
    pair = both(tmp_path, name)
    if pair is None:
        return  # refused by both
    light, real = pair
    family = real.model_type
    read_by_adapter: set[str] = set()
    from_light = exercise(light, read_by_adapter)
    if CASES[name][1]:
        assert used_transformers(light) == [], f"{name}: the light rules should answer alone"
    else:  # a form the rules leave to transformers (the value comparison below then proves the fallback)
        assert used_transformers(light), f"{name}: expected to need transformers"
    assert from_light == exercise(real), f"{name}: the adapter derives something else from the light config"
    names = read_by_adapter | set(FAMILIES.get(family, {})) | {"model_type", "architectures"}
    assert_same_attributes(light, real, names)


def test_refused_cases_are_refused_by_transformers(tmp_path):
    """The cases meant to exercise refusal do (so the comparison above is not vacuous for them)."""
    refused = set()
    for name in sorted(HUB):
        folder, _ = write(tmp_path / name, HUB[name][0])
        try:
            AutoConfig.from_pretrained(str(folder))
        except Exception:
            refused.add(name)
    assert refused == REFUSED


def test_every_supported_model_type_is_covered():
    families = {c.model_type for c in SAVED.values()}
    assert set(supported_model_types()) <= families
    assert set(supported_model_types()) <= set(FAMILIES)
    assert {json.get("model_type") for json, fast in HUB.values() if fast} >= {"llama", "bert", "gpt2", "qwen2"}


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - set(SUB_MODEL_TYPES)))
def test_aliases_are_the_attribute_map(family):
    cls = tf.CONFIG_MAPPING[family]
    rules = FAMILIES[family]
    assert {n: r.target for n, r in rules.items() if isinstance(r, Alias)} == cls.attribute_map
    nested = {n for n, r in rules.items() if isinstance(r, Nested)}
    assert nested == set(cls.sub_configs), f"{family}: sub-configs"


def test_unknown_model_type_is_refused_before_any_config_is_read(tmp_path):
    folder, _ = write(tmp_path, {"model_type": "not-a-transformer", "hidden_size": 8})
    (folder / "model.safetensors").write_bytes(b"")
    code = ("import sys\nfrom qkinspect.errors import UnsupportedModelError\nfrom qkinspect.loading import open_model\n"
            f"try:\n    open_model({str(folder)!r})\nexcept UnsupportedModelError:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('transformers')))")
    assert imported_by(code) == []


@pytest.mark.parametrize("bad", [dict(hidden_size=100, num_attention_heads=3), dict(hidden_size="64"),
                                 dict(num_hidden_layers=2, layer_types=["full_attention"]),
                                 dict(head_dim=5, hidden_size=20, num_attention_heads=4)])
def test_configs_transformers_refuses_are_still_refused(bad, tmp_path):
    config, state = tiny.llama()
    folder = tiny.write(tmp_path / "m", config, state)
    data = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**data, **bad}))
    # refused by transformers, or earlier, where config.json enters (qkinspect.loading.checked), naming the key
    with pytest.raises(CheckpointError, match="config.json: (transformers cannot read this config|num_attention_heads "
                                              "\\(3\\) is not a multiple|hidden_size is '64' \\(string\\))"):
        open_model(folder)


def test_docstring_examples():
    result = doctest.testmod(config)
    assert result.failed == 0 and result.attempted > 0


# -- what `qkinspect info` imports --------------------------------------------------------------------------------

INFO = ("import sys\nfrom typer.testing import CliRunner\nfrom qkinspect.cli.app import app\n"
        "r = CliRunner().invoke(app, {args!r})\nassert r.exit_code == 0, r.output\n"
        "print(sorted(m for m in sys.modules if m.startswith('transformers')))")


def imported_by(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return eval(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_info_on_the_demo_does_not_import_transformers_configs():
    mods = imported_by(INFO.format(args=["info"]))
    assert "transformers.models.bert.configuration_bert" not in mods
    assert "transformers.configuration_utils" not in mods


@pytest.mark.slow
def test_info_imports_transformers_only_when_the_rules_cannot_answer(tmp_path):
    config, state = tiny.llama()
    hub_style = {k: v for k, v in LLAMA2.items() if k not in ("hidden_size", "num_hidden_layers")}
    hub_style.update(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    folder = tiny.write(tmp_path / "plain", config, state)
    (folder / "config.json").write_text(json.dumps(hub_style))
    assert "transformers.models.llama.configuration_llama" not in imported_by(INFO.format(args=["info", str(folder)]))
    # Positive control: RoPE scaling the rules do not model is read by transformers, and the import shows.
    (folder / "config.json").write_text(json.dumps({**hub_style, "rope_scaling": {"rope_type": "linear", "factor": 2}}))
    assert "transformers.models.llama.configuration_llama" in imported_by(INFO.format(args=["info", str(folder)]))
