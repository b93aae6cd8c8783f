"""Fixtures for the atlas tests: tiny models of three families, shapes and formats written in code, and the sweep
tests' real Dask cluster on 127.0.0.1 (a `dask scheduler` and two `dask worker` processes, started for the module
and killed afterwards, each start bounded in time)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sweep.conftest import cli, cluster  # noqa: F401 - fixtures used by the atlas tests

NEEDS_DASK = "the atlas needs the sweep extra: pip install 'qkinspect[sweep]'"


def save_zoo(root: Path, scale: int = 1) -> dict[str, Path]:
    """A BERT encoder (safetensors folder, 3 layers), a grouped-query Llama decoder (GGUF file, 2 layers of 4
    query heads on 2 key/value heads; a safetensors folder of 4 layers when scaled) and a BART encoder-decoder (2
    encoder layers; 3 decoder layers with cross-attention, 2 heads of 16): three families, shapes and formats.
    `scale` widens them (slower models, to be caught mid-run)."""
    import torch
    from transformers import BartConfig, BartModel

    from tests.loading import tiny

    out = {"bert": tiny.write(root / "bert", *tiny.bert(seed=1, num_hidden_layers=3, hidden_size=32 * scale,
                                                              intermediate_size=37))}
    if scale == 1:
        out["llama"] = tiny.llama_gguf_with(root / "llama.gguf", tiny.llama(seed=2)[1])
    else:
        config, state = tiny.llama(seed=2, num_hidden_layers=4, hidden_size=64 * scale, head_dim=16 * scale)
        out["llama"] = tiny.write(root / "llama", config, state)
    torch.manual_seed(3)
    cfg = BartConfig(vocab_size=50, d_model=32 * scale, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
                     decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=16)
    BartModel(cfg).eval().save_pretrained(root / "bart", safe_serialization=True)
    out["bart"] = root / "bart"
    return out


@pytest.fixture(scope="session")
def zoo(tmp_path_factory) -> dict[str, Path]:
    return save_zoo(tmp_path_factory.mktemp("zoo"))
