"""Every family the vocabulary table maps reads its own tensors: the embedding and the unembedding the model's
public accessors give (get_input_embeddings, get_output_embeddings), and as the final norm the module whose output
the unembedding reads in a forward pass (hooks); encoders have none."""

from __future__ import annotations

import pytest
import torch

import qkinspect
from qkinspect.loading.vocab_names import VOCAB

V, D = 48, 32
DEC = dict(vocab_size=V, hidden_size=D, intermediate_size=40, num_hidden_layers=1, num_attention_heads=4,
           num_key_value_heads=2, max_position_embeddings=32)


def configs():
    import transformers as tf

    g = dict(vocab_size=V, n_embd=D, n_layer=1, n_head=4, n_positions=32)
    enc = dict(vocab_size=V, hidden_size=D, num_hidden_layers=1, num_attention_heads=4, intermediate_size=40,
               max_position_embeddings=34)
    return {
        "llama": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**DEC)),
        "mistral": lambda: tf.MistralForCausalLM(tf.MistralConfig(**DEC)),
        "qwen2": lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(**DEC)),
        "qwen3": lambda: tf.Qwen3ForCausalLM(tf.Qwen3Config(**DEC, head_dim=8)),
        "olmo2": lambda: tf.Olmo2ForCausalLM(tf.Olmo2Config(**DEC)),
        "granite": lambda: tf.GraniteForCausalLM(tf.GraniteConfig(**DEC)),
        "phi3": lambda: tf.Phi3ForCausalLM(tf.Phi3Config(**DEC, pad_token_id=0)),
        "gemma2": lambda: tf.Gemma2ForCausalLM(tf.Gemma2Config(**DEC, head_dim=8)),
        "cohere": lambda: tf.CohereForCausalLM(tf.CohereConfig(**DEC)),
        "stablelm": lambda: tf.StableLmForCausalLM(tf.StableLmConfig(**DEC)),
        "starcoder2": lambda: tf.Starcoder2ForCausalLM(tf.Starcoder2Config(**DEC)),
        "gpt2": lambda: tf.GPT2LMHeadModel(tf.GPT2Config(**g)),
        "gpt_neo": lambda: tf.GPTNeoForCausalLM(tf.GPTNeoConfig(vocab_size=V, hidden_size=D, num_layers=1,
                                                                num_heads=4, attention_types=[[["global"], 1]],
                                                                max_position_embeddings=32)),
        "gptj": lambda: tf.GPTJForCausalLM(tf.GPTJConfig(**g, rotary_dim=4)),
        "gpt_neox": lambda: tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(**{**DEC, "num_key_value_heads": 4})),
        "opt": lambda: tf.OPTForCausalLM(tf.OPTConfig(vocab_size=V, hidden_size=D, num_hidden_layers=1,
                                                      num_attention_heads=4, ffn_dim=40, word_embed_proj_dim=D,
                                                      max_position_embeddings=32)),
        "bloom": lambda: tf.BloomForCausalLM(tf.BloomConfig(vocab_size=V, hidden_size=D, n_layer=1, n_head=4)),
        "falcon": lambda: tf.FalconForCausalLM(tf.FalconConfig(vocab_size=V, hidden_size=D, num_hidden_layers=1,
                                                               num_attention_heads=4)),
        "phi": lambda: tf.PhiForCausalLM(tf.PhiConfig(**{**DEC, "num_key_value_heads": 4})),
        "mpt": lambda: tf.MptForCausalLM(tf.MptConfig(vocab_size=V, d_model=D, n_layers=1, n_heads=4,
                                                      max_seq_len=32)),
        "bert": lambda: tf.BertForMaskedLM(tf.BertConfig(**enc)),
        "roberta": lambda: tf.RobertaForMaskedLM(tf.RobertaConfig(**enc)),
        "electra": lambda: tf.ElectraForMaskedLM(tf.ElectraConfig(**enc, embedding_size=D)),
        "distilbert": lambda: tf.DistilBertForMaskedLM(tf.DistilBertConfig(vocab_size=V, dim=D, n_layers=1,
                                                                           n_heads=4, hidden_dim=40)),
    }


CASES = configs()


def test_the_cases_cover_most_of_the_table():
    assert len(set(CASES) & set(VOCAB)) >= 20


@pytest.mark.parametrize("family", sorted(CASES))
@pytest.mark.parametrize("tie", [True, False])
def test_the_write_side_reads_the_model_s_own_unembedding(tmp_path, family, tie):
    torch.manual_seed(0)
    model = CASES[family]()
    model.config.tie_word_embeddings = tie
    if not tie and model.get_output_embeddings() is not None:
        model.get_output_embeddings().weight = torch.nn.Parameter(torch.randn_like(model.get_input_embeddings().weight))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and "norm" in name.lower() or name.endswith(("ln_f.weight", "ln_1.weight")):
                p.uniform_(0.5, 1.5)
            elif p.dim() == 2 and p.shape[0] != V:
                p.normal_(0, 0.3)
    model.eval().save_pretrained(tmp_path, safe_serialization=True)
    res = qkinspect.directions(tmp_path, layers="0", top_directions=1, top_tokens=5, precision="float64")
    rd = res.readout
    E = model.get_input_embeddings().weight.detach().double()
    out = model.get_output_embeddings()
    U = E if out is None or tie else out.weight.detach().double()
    assert rd.tied == (out is None or tie or torch.equal(out.weight, model.get_input_embeddings().weight))
    from safetensors.torch import load_file

    sd = {k: v.double() for k, v in load_file(tmp_path / "model.safetensors").items()}  # the names as saved
    assert torch.equal(sd[rd.embedding], E) and torch.equal(sd[rd.unembedding], U)
    if rd.final_norm is not None:  # the norm named is the one whose output the unembedding reads
        norm = dict(model.named_modules())[rd.final_norm.rsplit(".", 1)[0]]
        seen: dict = {}
        hooks = [norm.register_forward_hook(lambda m, a, o: seen.setdefault("norm", o)),
                 out.register_forward_hook(lambda m, a, o: seen.setdefault("head", a[0]))]
        with torch.no_grad():
            model(torch.tensor([[1, 2, 3, 4]]))
        for h in hooks:
            h.remove()
        assert torch.equal(seen["norm"], seen["head"])
    else:
        assert family in ("bert", "roberta", "electra", "distilbert")
    assert {r.side for r in res.records} == {"read", "write", "query", "key"}
