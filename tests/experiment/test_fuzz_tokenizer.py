"""Fuzzing what `experiment` hands to transformers (issue 25): the tokenizer files of a tiny BERT (tokenizer.json,
vocab.txt, tokenizer_config.json, contents and raw bytes) and the config values the runner uses are mutated
(hypothesis), and every run must end in exit 0 with an experiment document, or exit 2 with exactly one `error:`
line, nothing on stdout and no traceback, within 60 s. Derandomized and few by default; a longer hunt:

    QKINSPECT_FUZZ_EXAMPLES=300 python -m pytest tests/experiment/test_fuzz_tokenizer.py
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from qkinspect.cli.app import app
from tests.experiment import tiny_models as tiny
from tests.loading.test_fuzz_hostile import FUZZ, SECONDS, apply_bytes, byte_edits, json_values, snapshot

ARGS = ("--edit", "ablate", "--no-reference", "--layers", "0", "--heads", "0", "--tokens", "32", "--window", "16",
        "--format", "json")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz_tokenizer")
    folder = tiny.bert(root / "bert")
    r = CliRunner().invoke(app, ["experiment", str(folder), *ARGS])  # imports and first load, once
    assert r.exit_code == 0, r.stderr
    return folder


def check_experiment(model: Path, work: Path, capfd=None) -> None:
    """Run experiment in-process; `capfd` (pytest's descriptor capture) also sees what native code writes on
    descriptor 2, which must stay empty."""
    if capfd is not None:
        capfd.readouterr()
    before = snapshot(work)
    t0 = time.perf_counter()
    r = CliRunner().invoke(app, ["experiment", str(model), *ARGS])
    elapsed = time.perf_counter() - t0
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    if r.exit_code == 0:
        doc = json.loads(r.stdout)
        assert doc["kind"] == "experiment" and doc["runs"], "exit 0 without runs"
    else:
        assert r.exit_code == 2, (r.exit_code, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
        assert r.stdout == ""
    assert snapshot(work) == before  # the model folder is never written
    if capfd is not None:
        err = capfd.readouterr().err
        assert "panicked" not in err and "Traceback" not in err, err
    assert elapsed < SECONDS, f"took {elapsed:.1f} s"


def mutated(base: Path, work: Path) -> Path:
    shutil.copytree(base, work / "m")
    return work / "m"


def set_path(data: dict, path: tuple[str, ...], value) -> None:
    target = data
    for key in path[:-1]:
        if not isinstance(target.get(key), dict):
            target[key] = {}
        target = target[key]
    if value == "<delete>":
        target.pop(path[-1], None)
    else:
        target[path[-1]] = value


TOKENIZER_JSON_PATHS = [("model",), ("model", "type"), ("model", "vocab"), ("model", "unk_token"),
                        ("model", "continuing_subword_prefix"), ("model", "max_input_chars_per_word"),
                        ("added_tokens",), ("normalizer",), ("pre_tokenizer",), ("post_processor",), ("decoder",),
                        ("truncation",), ("padding",), ("version",)]
TOKENIZER_CONFIG_KEYS = ["tokenizer_class", "unk_token", "cls_token", "sep_token", "mask_token", "pad_token",
                         "do_lower_case", "model_max_length", "auto_map", "added_tokens_decoder",
                         "extra_special_tokens", "backend", "strip_accents", "tokenize_chinese_chars"]
tokens = st.sampled_from(["[UNK]", "[CLS]", "[SEP]", "[MASK]", "[PAD]", "a", "##a", "", " ", "\x00", "é" * 300])
token_values = (json_values | tokens | st.dictionaries(st.sampled_from(["content", "special", "lstrip", "id"]),
                                                      json_values | tokens, max_size=3)
                | st.dictionaries(tokens, st.integers(-3, 10**6), max_size=4) | st.just("<delete>"))


pieces = st.sampled_from(["a", "b", "ab", "##", "##b", "", "Ġ", "q"]) | st.text(max_size=3)
models_ = st.fixed_dictionaries(
    {"type": st.sampled_from(["BPE", "WordPiece", "WordLevel", "Unigram"])},
    optional={"vocab": st.dictionaries(pieces, st.integers(-1, 40), max_size=6)
              | st.lists(st.tuples(pieces, st.floats(-5, 0)), max_size=4),
              "merges": st.lists(st.lists(pieces, min_size=0, max_size=3) | pieces, max_size=4),
              "continuing_subword_prefix": st.none() | pieces, "end_of_word_suffix": st.none() | pieces,
              "unk_token": st.none() | pieces, "unk_id": st.none() | st.integers(-1, 10),
              "dropout": st.none() | st.floats(-1, 2), "byte_fallback": st.booleans(), "fuse_unk": st.booleans()})


@FUZZ
@given(edits=st.lists(st.tuples(st.sampled_from(TOKENIZER_JSON_PATHS), token_values), min_size=1, max_size=3),
       model=st.none() | models_)
def test_fuzz_tokenizer_json(base, capfd, edits, model):
    """Values of tokenizer.json's fields, and whole tokenizer models of each kind (a BPE merge shorter than its
    continuing_subword_prefix made the Rust library panic: a BaseException, printed on descriptor 2)."""
    if model is not None:
        edits = [*edits, (("model",), model)]
    with tempfile.TemporaryDirectory() as d:
        m = mutated(base, Path(d))
        data = json.loads((m / "tokenizer.json").read_text())
        for path, value in edits:
            set_path(data, path, value)
        (m / "tokenizer.json").write_text(json.dumps(data, allow_nan=True))
        check_experiment(m, Path(d), capfd)


@FUZZ
@given(ops=byte_edits(4000, 4000))
def test_fuzz_tokenizer_json_bytes(base, capfd, ops):
    with tempfile.TemporaryDirectory() as d:
        m = mutated(base, Path(d))
        apply_bytes(m / "tokenizer.json", ops)
        check_experiment(m, Path(d), capfd)


@FUZZ
@given(lines=st.lists(tokens | st.text(max_size=8), max_size=40), keep=st.booleans(),
       ops=st.none() | byte_edits(600, 600))
def test_fuzz_vocab_txt(base, lines, keep, ops):
    """tokenizer.json removed: transformers builds the tokenizer from vocab.txt (the file kept with `lines` added,
    or replaced by them), then a few raw byte edits."""
    with tempfile.TemporaryDirectory() as d:
        m = mutated(base, Path(d))
        (m / "tokenizer.json").unlink()
        vocab = m / "vocab.txt"
        vocab.write_text((vocab.read_text() if keep else "") + "\n".join(lines) + "\n", encoding="utf-8")
        if ops is not None:
            apply_bytes(vocab, ops)
        check_experiment(m, Path(d))


@FUZZ
@given(edits=st.lists(st.tuples(st.sampled_from(TOKENIZER_CONFIG_KEYS) | st.text(min_size=1, max_size=8),
                                token_values), min_size=1, max_size=3), fast=st.booleans())
def test_fuzz_tokenizer_config(base, edits, fast):
    with tempfile.TemporaryDirectory() as d:
        m = mutated(base, Path(d))
        if not fast:
            (m / "tokenizer.json").unlink()
        data = json.loads((m / "tokenizer_config.json").read_text())
        for key, value in edits:
            set_path(data, (key,), value)
        (m / "tokenizer_config.json").write_text(json.dumps(data, allow_nan=True))
        check_experiment(m, Path(d))


RUNNER_CONFIG_KEYS = ["pad_token_id", "bos_token_id", "eos_token_id", "attn_implementation", "vocab_size",
                      "max_position_embeddings", "position_embedding_type", "type_vocab_size", "layer_norm_eps",
                      "hidden_act", "auto_map", "architectures", "torch_dtype", "is_decoder", "use_cache"]


@FUZZ
@given(edits=st.lists(st.tuples(st.sampled_from(RUNNER_CONFIG_KEYS), json_values | st.just("<delete>")),
                      min_size=1, max_size=3))
def test_fuzz_runner_config_values(base, edits):
    """config.json values analyze does not read but transformers' model does."""
    with tempfile.TemporaryDirectory() as d:
        m = mutated(base, Path(d))
        data = json.loads((m / "config.json").read_text())
        for key, value in edits:
            set_path(data, (key,), value)
        (m / "config.json").write_text(json.dumps(data, allow_nan=True))
        check_experiment(m, Path(d))


short_text = st.text(st.characters(codec="utf-8"), max_size=6)
gguf_tokenizer_meta = st.fixed_dictionaries({}, optional={
    "model": st.sampled_from(["gpt2", "llama", "bert", "t5", "nope", ""]),
    "tokens": st.lists(st.sampled_from(["<unk>", "<s>", "</s>", "t", "h", "Ġ", "th"]) | short_text, max_size=12),
    "merges": st.lists(st.sampled_from(["t h", "Ġ t", "h e", "q zz", "", " ", "a b c"]) | short_text, max_size=6),
    "token_type": st.lists(st.integers(-5, 9), min_size=1, max_size=12),
    "scores": st.lists(st.floats(width=32, allow_nan=True), min_size=1, max_size=12),
    "bos_token_id": st.integers(0, 2**64 - 1) | st.integers(0, 300),
    "eos_token_id": st.integers(0, 2**64 - 1) | st.integers(0, 300),
    "unknown_token_id": st.integers(0, 300),
    "padding_token_id": st.integers(0, 300),
    "pre": st.sampled_from(["llama3", "qwen2", "gpt-4o", "nope", ""]),
})


@FUZZ
@given(meta=gguf_tokenizer_meta)
def test_fuzz_gguf_tokenizer_metadata(capfd, meta):
    """A tiny Llama GGUF whose tokenizer.ggml.* metadata is replaced (transformers builds the tokenizer from it)."""
    from tests.experiment import tiny_gguf

    with tempfile.TemporaryDirectory() as d:
        path = tiny_gguf.llama_gguf(Path(d) / "m.gguf", **meta)
        check_experiment(path, Path(d), capfd)
