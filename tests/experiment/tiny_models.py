"""Tiny random models with heads, written in code with a character-level tokenizer: the families `experiment`
runs (a Llama-type causal LM with grouped-query attention, BERT with and without a masked-LM head, GPT-2)."""

from __future__ import annotations

import string
from pathlib import Path

import torch

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CHARS = list(string.ascii_lowercase + string.digits + string.punctuation)
VOCAB = SPECIAL + CHARS + [f"##{c}" for c in CHARS]  # every lower-case word splits into characters


def save_tokenizer(folder: Path) -> Path:
    """A WordPiece tokenizer over single characters, saved into `folder` (AutoTokenizer reads it back)."""
    from qkinspect.experiment.model.runtime import wordpiece

    folder.mkdir(parents=True, exist_ok=True)
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n")
    wordpiece(vocab).save_pretrained(folder)
    return folder


def _random_norms(model: torch.nn.Module) -> None:
    """Norm gains away from 1, so a mix-up between tensors cannot hide behind all-ones vectors."""
    with torch.no_grad():
        for m in model.modules():
            if "Norm" in type(m).__name__ and getattr(m, "weight", None) is not None:
                m.weight.uniform_(0.5, 1.5)


def _random_qkv_biases(model: torch.nn.Module) -> torch.nn.Module:
    """q/k/v biases away from zero (transformers starts them at 0), so a dropped bias changes the loss."""
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return model


def _save(model, folder: Path) -> Path:
    _random_norms(model)
    model.save_pretrained(folder)
    return save_tokenizer(folder)


def llama(folder: Path, seed: int = 0, **overrides) -> Path:
    """LlamaForCausalLM: 3 layers, 4 query heads reading 2 key/value heads, RoPE, untied head."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               intermediate_size=96, vocab_size=len(VOCAB), max_position_embeddings=64, rms_norm_eps=1e-5,
               tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    return _save(LlamaForCausalLM(LlamaConfig(**{**cfg, **overrides})).eval(), folder)


def bert(folder: Path, seed: int = 0, head: bool = True) -> Path:
    """BertForMaskedLM (head=True) or a bare BertModel (a sentence-transformers-like encoder): 2 layers, 4 heads."""
    from transformers import BertConfig, BertForMaskedLM, BertModel

    torch.manual_seed(seed)
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                        vocab_size=len(VOCAB), max_position_embeddings=64)
    return _save((BertForMaskedLM if head else BertModel)(config).eval(), folder)


def gpt2(folder: Path, seed: int = 0) -> Path:
    """GPT2LMHeadModel: 2 layers, 4 heads, fused c_attn."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, vocab_size=len(VOCAB),
                        bos_token_id=2, eos_token_id=3)
    return _save(GPT2LMHeadModel(config).eval(), folder)


def mistral(folder: Path, seed: int = 0) -> Path:
    """MistralForCausalLM with a sliding window shorter than the test windows (grouped-query, rotary)."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(seed)
    config = MistralConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           intermediate_size=48, vocab_size=len(VOCAB), max_position_embeddings=64,
                           sliding_window=8, tie_word_embeddings=False)
    return _save(MistralForCausalLM(config).eval(), folder)


def roberta(folder: Path, seed: int = 0) -> Path:
    """RobertaForMaskedLM: BERT's modules under roberta.*, positions offset by the padding index."""
    from transformers import RobertaConfig, RobertaForMaskedLM

    torch.manual_seed(seed)
    config = RobertaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                           vocab_size=len(VOCAB), max_position_embeddings=66, pad_token_id=0)
    return _save(RobertaForMaskedLM(config).eval(), folder)


def qwen2(folder: Path, seed: int = 0) -> Path:
    """Qwen2ForCausalLM: Llama's modules with q/k/v biases (random, so a dropped bias shows), grouped-query."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=48, vocab_size=len(VOCAB), max_position_embeddings=64,
                         tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config).eval()
    return _save(_random_qkv_biases(model), folder)


def mixtral(folder: Path, seed: int = 0) -> Path:
    """MixtralForCausalLM: Mistral's attention with a mixture of experts after it (2 of 4 experts per token)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(seed)
    config = MixtralConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           intermediate_size=48, vocab_size=len(VOCAB), max_position_embeddings=64,
                           num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False)
    return _save(MixtralForCausalLM(config).eval(), folder)


def qwen2_moe(folder: Path, seed: int = 0) -> Path:
    """Qwen2MoeForCausalLM: Qwen2's attention (q/k/v biases, randomised) with experts and a shared expert."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    torch.manual_seed(seed)
    config = Qwen2MoeConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=48, moe_intermediate_size=16, shared_expert_intermediate_size=24,
                            num_experts=4, num_experts_per_tok=2, vocab_size=len(VOCAB), max_position_embeddings=64,
                            tie_word_embeddings=False)
    model = Qwen2MoeForCausalLM(config).eval()
    return _save(_random_qkv_biases(model), folder)


# -- the families written back by qkinspect.experiment.model.writeback and the q/k-norm Llama-types -----------------

_SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
              vocab_size=len(VOCAB), max_position_embeddings=64)


def _random_biases(model: torch.nn.Module, names: tuple[str, ...]) -> torch.nn.Module:
    """Biases of the named projections away from zero (transformers starts them at 0)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") and any(f".{n}." in name for n in names):
                p.normal_(0, 0.5)
    return model


def qwen3(folder: Path, seed: int = 0) -> Path:
    """Qwen3ForCausalLM: per-head q/k RMSNorm (gain (d,)), q/k/v biases (random), head_dim 12 (H*d != D), GQA."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(**_SMALL, num_key_value_heads=2, head_dim=12, attention_bias=True,
                         tie_word_embeddings=False)
    return _save(_random_biases(Qwen3ForCausalLM(config).eval(), ("q_proj", "k_proj", "v_proj")), folder)


def qwen3_moe(folder: Path, seed: int = 0) -> Path:
    """Qwen3MoeForCausalLM: Qwen3's attention, experts after it."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    config = Qwen3MoeConfig(**_SMALL, num_key_value_heads=2, head_dim=8, moe_intermediate_size=16, num_experts=4,
                            num_experts_per_tok=2, tie_word_embeddings=False)
    return _save(Qwen3MoeForCausalLM(config).eval(), folder)


def gemma(folder: Path, seed: int = 0) -> Path:
    """GemmaForCausalLM: RMSNorm multiplying by (1 + weight), multi-query (1 KV head), head_dim 12, tied head."""
    from transformers import GemmaConfig, GemmaForCausalLM

    torch.manual_seed(seed)
    config = GemmaConfig(**_SMALL, num_key_value_heads=1, head_dim=12, pad_token_id=0, bos_token_id=2,
                         eos_token_id=3)
    return _save(GemmaForCausalLM(config).eval(), folder)


def gemma2(folder: Path, seed: int = 0) -> Path:
    """Gemma2ForCausalLM: scores scaled by query_pre_attn_scalar, soft-capped, sliding and full layers."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(seed)
    config = Gemma2Config(**_SMALL, num_key_value_heads=2, head_dim=12, query_pre_attn_scalar=10,
                          sliding_window=8, attn_logit_softcapping=5.0, final_logit_softcapping=30.0,
                          pad_token_id=0, bos_token_id=2, eos_token_id=3)
    return _save(Gemma2ForCausalLM(config).eval(), folder)


def gemma3(folder: Path, seed: int = 0) -> Path:
    """Gemma3ForCausalLM (text): Gemma2 plus per-head q/k RMSNorm whose gains are 1 + weight."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    config = Gemma3TextConfig(**_SMALL, num_key_value_heads=2, head_dim=12, query_pre_attn_scalar=10,
                              sliding_window=8, layer_types=["sliding_attention", "full_attention"],
                              pad_token_id=0, bos_token_id=2, eos_token_id=3)
    return _save(Gemma3ForCausalLM(config).eval(), folder)


def olmo2(folder: Path, seed: int = 0) -> Path:
    """Olmo2ForCausalLM: q/k RMSNorm over the whole projection (gains (H*d,), (G*d,)), GQA, no input norm."""
    from transformers import Olmo2Config, Olmo2ForCausalLM

    torch.manual_seed(seed)
    config = Olmo2Config(**_SMALL, num_key_value_heads=2, pad_token_id=0, bos_token_id=2, eos_token_id=3,
                         tie_word_embeddings=False)
    return _save(Olmo2ForCausalLM(config).eval(), folder)


def phi3(folder: Path, seed: int = 0) -> Path:
    """Phi3ForCausalLM: one fused qkv_proj sectioned [q | k | v], grouped-query, partial rotary."""
    from transformers import Phi3Config, Phi3ForCausalLM

    torch.manual_seed(seed)
    config = Phi3Config(**_SMALL, num_key_value_heads=2, original_max_position_embeddings=64, pad_token_id=0,
                        bos_token_id=2, eos_token_id=3, tie_word_embeddings=False,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                         "partial_rotary_factor": 0.5})
    return _save(Phi3ForCausalLM(config).eval(), folder)


def gpt_neox(folder: Path, seed: int = 0) -> Path:
    """GPTNeoXForCausalLM (Pythia): fused query_key_value interleaved per head, biases (random), partial rotary."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(seed)
    config = GPTNeoXConfig(**_SMALL, bos_token_id=2, eos_token_id=3, tie_word_embeddings=False,
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                            "partial_rotary_factor": 0.5})
    return _save(_random_biases(GPTNeoXForCausalLM(config).eval(), ("query_key_value", "dense")), folder)


WRITEBACK_FAMILIES = {"qwen3": qwen3, "qwen3_moe": qwen3_moe, "gemma": gemma, "gemma2": gemma2, "gemma3": gemma3,
                      "olmo2": olmo2, "phi3": phi3, "gpt_neox": gpt_neox}
