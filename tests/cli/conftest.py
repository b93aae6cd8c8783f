"""Fixtures for CLI tests: a CliRunner, and tiny BERT checkpoints saved with save_pretrained."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from qkinspect.cli.app import app


def save_bert(path, *, seed: int, hidden: int = 32, heads: int = 4, layers: int = 2):
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=50, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=2 * hidden, max_position_embeddings=16)
    BertModel(cfg).eval().save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory):
    return save_bert(tmp_path_factory.mktemp("bert_a"), seed=0)


@pytest.fixture(scope="session")
def tiny_bert_b(tmp_path_factory):
    """Same architecture as tiny_bert, other weights (a 'fine-tuned' checkpoint)."""
    return save_bert(tmp_path_factory.mktemp("bert_b"), seed=1)


@pytest.fixture(scope="session")
def tiny_bert_wide(tmp_path_factory):
    """Another shape: 8 heads of 8 dims over d_model 64."""
    return save_bert(tmp_path_factory.mktemp("bert_wide"), seed=2, hidden=64, heads=8)


@pytest.fixture
def cli():
    """invoke(*args) -> Result with separate .stdout and .stderr."""
    runner = CliRunner()

    def invoke(*args: str, **kw):
        return runner.invoke(app, [str(a) for a in args], **kw)

    return invoke


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    """Grouped-query attention with rotary positions: 4 query heads share 2 key/value heads."""
    import torch
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)
    path = tmp_path_factory.mktemp("llama")
    LlamaModel(cfg).eval().save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="session")
def tiny_bart(tmp_path_factory):
    """An encoder-decoder: encoder, decoder and cross-attention blocks."""
    import torch
    from transformers import BartConfig, BartModel

    torch.manual_seed(4)
    cfg = BartConfig(vocab_size=50, d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=4,
                     decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=16)
    path = tmp_path_factory.mktemp("bart")
    BartModel(cfg).eval().save_pretrained(path, safe_serialization=True)
    return path
