"""Fixtures for the figure and report tests: tiny checkpoints (GQA decoder, encoder-decoder) saved with
save_pretrained, and their analyses (with the head-by-head overlap the heads figure needs)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from qkinspect.cli.app import app

METRICS = ["default", "head_overlap"]


def save_llama(path, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, vocab_size=99)
    LlamaForCausalLM(cfg).eval().save_pretrained(path, safe_serialization=True)
    return path


def save_bart(path, seed: int = 0):
    import torch
    from transformers import BartConfig, BartModel

    torch.manual_seed(seed)
    cfg = BartConfig(vocab_size=99, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                     decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32)
    BartModel(cfg).eval().save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="session")
def llama_path(tmp_path_factory):
    return save_llama(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def llama_b_path(tmp_path_factory):
    """Same architecture as llama_path, other weights."""
    return save_llama(tmp_path_factory.mktemp("tiny_llama_b"), seed=1)


@pytest.fixture(scope="session")
def bart_path(tmp_path_factory):
    return save_bart(tmp_path_factory.mktemp("tiny_bart"))


@pytest.fixture(scope="session")
def results(llama_path, bart_path):
    """name -> AnalysisResult for the demo model, the tiny GQA decoder and the tiny BART."""
    import qkinspect

    specs = {"demo": None, "llama": str(llama_path), "bart": str(bart_path)}
    return {k: qkinspect.analyze(v, metrics=METRICS) for k, v in specs.items()}


@pytest.fixture
def cli():
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, [str(a) for a in args])

    return invoke
