"""Where each family keeps its token embedding, its unembedding and its final norm: the one table of these names.

Names are Hugging Face state-dict names without the base-model prefix (the tensor source finds ``model.``,
``transformer.`` ...), as the adapters name attention tensors; the unembedding (``lm_head.weight``) sits at the top
level, outside the base model. The GGUF source maps llama.cpp's ``token_embd`` / ``output`` / ``output_norm`` onto
these names (`GGUF_ROLES`), so one table serves both formats.

Encoders (BERT and its relatives) have no final norm before a linear unembedding: their masked-LM head runs a
dense layer, an activation and a LayerNorm before the decoder, which shares the word embeddings. Their write side
is read through the word embeddings (or the MLM decoder's own weight where the config unties it), no gain folded.

Example:
    >>> names = vocab_names("llama")
    >>> names.embed, names.unembed, names.final_norm
    ('embed_tokens.weight', 'lm_head.weight', 'norm.weight')
"""

from __future__ import annotations

from dataclasses import dataclass

from qkinspect.errors import UnsupportedModelError


@dataclass(frozen=True)
class VocabNames:
    """The token embedding (V, D), the unembedding (V, D) when stored apart, and the final norm before it.

    `final_norm` None: the family has no norm between the residual stream and a linear unembedding (encoders);
    `norm_bias` names a LayerNorm's bias (not used for directions: a constant offset of every logit);
    `unit_offset`: the norm multiplies by 1 + weight (Gemma); `older` names the unembedding may have in checkpoints
    written before transformers renamed it (GPT-NeoX's ``embed_out``)."""

    embed: str
    unembed: str | None
    final_norm: str | None
    norm_kind: str = "rmsnorm"
    unit_offset: bool = False
    older: tuple[str, ...] = ()

    @property
    def unembeds(self) -> tuple[str, ...]:
        """The unembedding's names, the current one first."""
        return () if self.unembed is None else (self.unembed, *self.older)

    @property
    def norm_bias(self) -> str | None:
        if self.final_norm is None or self.norm_kind != "layernorm":
            return None
        return self.final_norm.removesuffix(".weight") + ".bias"


_LLAMA = VocabNames("embed_tokens.weight", "lm_head.weight", "norm.weight")
_LLAMA_LN = VocabNames("embed_tokens.weight", "lm_head.weight", "norm.weight", "layernorm")
_GEMMA = VocabNames("embed_tokens.weight", "lm_head.weight", "norm.weight", unit_offset=True)
_GPT2 = VocabNames("wte.weight", "lm_head.weight", "ln_f.weight", "layernorm")
_BLOOM = VocabNames("word_embeddings.weight", "lm_head.weight", "ln_f.weight", "layernorm")
_BERT = VocabNames("embeddings.word_embeddings.weight", "cls.predictions.decoder.weight", None)

VOCAB: dict[str, VocabNames] = {
    **dict.fromkeys(("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "olmo2", "granite",
                     "phi3", "deepseek_v2", "deepseek_v3"), _LLAMA),
    **dict.fromkeys(("cohere", "stablelm", "starcoder2", "olmo"), _LLAMA_LN),
    **dict.fromkeys(("gemma", "gemma2", "gemma3_text"), _GEMMA),
    **dict.fromkeys(("gpt2", "gptj", "gpt_neo"), _GPT2),
    **dict.fromkeys(("bloom", "falcon"), _BLOOM),
    "phi": VocabNames("embed_tokens.weight", "lm_head.weight", "final_layernorm.weight", "layernorm"),
    "gpt_neox": VocabNames("embed_in.weight", "lm_head.weight", "final_layer_norm.weight", "layernorm",
                           older=("embed_out.weight",)),
    "opt": VocabNames("decoder.embed_tokens.weight", "lm_head.weight", "decoder.final_layer_norm.weight",
                      "layernorm"),
    "mpt": VocabNames("wte.weight", "lm_head.weight", "norm_f.weight", "layernorm"),
    "bert": _BERT,
    **dict.fromkeys(("roberta", "xlm-roberta", "camembert"),
                    VocabNames("embeddings.word_embeddings.weight", "lm_head.decoder.weight", None)),
    "electra": VocabNames("embeddings.word_embeddings.weight", "generator_lm_head.weight", None),
    "distilbert": VocabNames("embeddings.word_embeddings.weight", "vocab_projector.weight", None),
}

# llama.cpp's names for the three tensors -> the field of VocabNames that names them in Hugging Face's layout
GGUF_ROLES = {"token_embd.weight": "embed", "output.weight": "unembed", "output_norm.weight": "final_norm",
              "output_norm.bias": "norm_bias"}


def vocab_names(model_type: str) -> VocabNames:
    """The family's names; UnsupportedModelError (exit 2) for a family whose vocabulary tensors are not mapped."""
    try:
        return VOCAB[model_type]
    except KeyError:
        raise UnsupportedModelError(
            f"model_type {model_type!r}: its token embedding and unembedding are not mapped; directions are read "
            f"for {', '.join(sorted(VOCAB))}") from None


__all__ = ["VOCAB", "VocabNames", "vocab_names", "GGUF_ROLES"]
