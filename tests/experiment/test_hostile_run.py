"""Hostile checkpoints for `experiment` (issue 25): what transformers would raise on bad tokenizer files, configs
and GGUF tokenizer metadata is one `error:` line naming the file, exit 2; files outside the model's folder are
never opened; nothing but that line reaches stderr."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from qkinspect.cli.app import app
from tests.experiment import tiny_gguf
from tests.experiment import tiny_models as tiny
from tests.one_line import one_error_line

SMALL = ("--edit", "ablate", "--no-reference", "--layers", "0", "--heads", "0", "--tokens", "64", "--window", "16",
         "--format", "json")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile_run")
    return {"bert": tiny.bert(root / "bert"), "llama": tiny.llama(root / "llama"),
            "gguf": tiny_gguf.llama_gguf(root / "tiny.gguf")}


def experiment(spec, *extra):
    return CliRunner().invoke(app, ["experiment", str(spec), *SMALL, *map(str, extra)])


def quiet(stderr: str) -> bool:
    """Nothing on stderr but the experiment's own note that SMALL scores too few tokens (notes go to stderr
    whatever -o is): no line of transformers', no progress bar, no warning."""
    return all(line.startswith("note: only ") and "tokens were scored" in line for line in stderr.splitlines())


def copy(models, name: str, tmp_path: Path) -> Path:
    shutil.copytree(models[name], tmp_path / name)
    return tmp_path / name


def edit_json(path: Path, **values) -> None:
    data = json.loads(path.read_text())
    data.update(values)
    path.write_text(json.dumps(data))


# -- class 2: transformers' errors are one line naming the file ------------------------------------------------


def without_tokenizer_json(m: Path) -> None:
    (m / "tokenizer.json").unlink()


TOKENIZER_CASES = {
    "tokenizer.json of {}": (lambda m: (m / "tokenizer.json").write_text("{}"), "tokenizer.json"),
    "tokenizer.json a list": (lambda m: (m / "tokenizer.json").write_text("[1]"), "tokenizer.json"),
    "binary vocab.txt": (lambda m: (without_tokenizer_json(m), (m / "vocab.txt").write_bytes(bytes(range(256)))),
                         "vocab.txt"),
    "vocab.txt without [UNK]": (lambda m: (without_tokenizer_json(m), (m / "vocab.txt").write_text("a\nb\n")),
                                "vocab.txt"),
    "unknown tokenizer_class": (lambda m: (without_tokenizer_json(m),
                                           edit_json(m / "tokenizer_config.json", tokenizer_class="NopeTokenizer")),
                                "vocab.txt"),
    "tokenizer_config.json not an object": (lambda m: (m / "tokenizer_config.json").write_text("[]"),
                                            "tokenizer_config.json"),
}


@pytest.mark.parametrize("case", list(TOKENIZER_CASES))
def test_bad_tokenizer_files_are_one_line_naming_the_file(models, tmp_path, case):
    mutate, named = TOKENIZER_CASES[case]
    m = copy(models, "bert", tmp_path)
    mutate(m)
    one_error_line(experiment(m), str(m / named))


@pytest.mark.parametrize("file", ["tokenizer_config.json", "config.json"])
@pytest.mark.parametrize("value", [["a"], 5, "x", {"AutoTokenizer": ["tok.Remote", None]},
                                   {"AutoModelForMaskedLM": "m.Remote", "AutoConfig": "c.Remote"}])
def test_auto_map_is_never_seen_by_transformers(models, tmp_path, file, value):
    """auto_map names remote code, which is never run: the model_type chooses transformers' own classes, and a
    malformed auto_map (which transformers reads before it decides not to use it) changes nothing."""
    m = copy(models, "bert", tmp_path)
    edit_json(m / file, auto_map=value)
    r = experiment(m)
    assert r.exit_code == 0 and quiet(r.stderr), r.stderr


CONFIG_CASES = {
    "pad_token_id out of range": ({"pad_token_id": 10**6}, "pad_token_id 1000000 is outside the vocabulary"),
    "pad_token_id a string": ({"pad_token_id": "0"}, "pad_token_id"),
    "bos_token_id a list": ({"bos_token_id": [1, 2]}, "bos_token_id"),
    "unknown rope_type": ({"rope_parameters": {"rope_type": "nope", "rope_theta": 10000.0}}, "rope_type 'nope'"),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_config_values_the_runner_uses_are_checked(models, tmp_path, case):
    values, says = CONFIG_CASES[case]
    m = copy(models, "llama", tmp_path)
    edit_json(m / "config.json", **values)
    assert says in one_error_line(experiment(m), str(m / "config.json"))


@pytest.mark.parametrize("values", [{"attn_implementation": "flash_attention_2"},
                                    {"_attn_implementation": "flex_attention", "output_attentions": True},
                                    {"experts_implementation": "grouped_mm"}, {"return_dict": False},
                                    {"torchscript": True, "use_cache": True, "output_hidden_states": True}])
def test_how_to_run_switches_in_the_config_are_not_used(models, tmp_path, values):
    """flash_attention_2 (not installed), tuple outputs ...: the runner decides how the model runs (transformers'
    default kernel for the family), so the loss is the unchanged checkpoint's."""
    m = copy(models, "llama", tmp_path)
    edit_json(m / "config.json", **values)
    r = experiment(m)
    assert r.exit_code == 0 and quiet(r.stderr), r.stderr
    base = json.loads(experiment(models["llama"]).stdout)["baseline"]
    assert json.loads(r.stdout)["baseline"] == base


@pytest.mark.parametrize("edit", ["rank:³", "rank:٣", "rank:1²", "rank:", "rank:-1", "rank:1e3"])
def test_rank_takes_ascii_digits_only(models, edit):
    r = CliRunner().invoke(app, ["experiment", str(models["llama"]), "--edit", edit])
    one_error_line(r, "rank takes a whole number")


GGUF_CASES = {
    "huge bos_token_id": ({"bos_token_id": 2**40}, "'tokenizer.ggml.bos_token_id' is 1099511627776"),
    "eos_token_id past the tokens": ({"eos_token_id": 262}, "'tokenizer.ggml.eos_token_id' is 262"),
    "empty token list": ({"tokens": []}, "'tokenizer.ggml.tokens' is empty"),
    "a merge naming a missing token": ({"merges": ["t h", "q zz"]}, "transformers cannot build a tokenizer"),
    "unknown tokenizer model": ({"model": "nope"}, "transformers cannot build a tokenizer"),
    "no tokenizer at all": ({"tokens": None, "merges": None, "token_type": None, "bos_token_id": None,
                             "eos_token_id": None, "unknown_token_id": None, "model": None},
                            "no tokenizer in its metadata (tokenizer.ggml.tokens); name one with --tokenizer"),
}


@pytest.mark.parametrize("case", list(GGUF_CASES))
def test_bad_gguf_tokenizer_metadata_is_one_line(tmp_path, case):
    meta, says = GGUF_CASES[case]
    path = tiny_gguf.llama_gguf(tmp_path / "m.gguf", **meta)
    assert says in one_error_line(experiment(path), str(path))


def test_a_tokenizer_giving_ids_past_the_embeddings_is_refused(models, tmp_path):
    """A tokenizer with more tokens than the model has embedding rows: refused before the forward pass."""
    m = copy(models, "bert", tmp_path)
    (m / "tokenizer.json").unlink()
    (m / "vocab.txt").write_text("\n".join(tiny.VOCAB + [f"extra{i}" for i in range(300)] + ["hello"]) + "\n")
    path = tmp_path / "t.txt"
    path.write_text("hello " * 200)
    assert "but the model has 141 token embeddings" in one_error_line(experiment(m, "--text", path), "vocab.txt")



def bpe_panicking_tokenizer_json() -> str:
    """A BPE tokenizer.json whose merge is shorter than its continuing_subword_prefix: the tokenizers library
    panics (Rust) while it builds the model, printing on descriptor 2 and raising a BaseException."""
    return json.dumps({"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
                       "normalizer": None, "pre_tokenizer": None, "post_processor": None, "decoder": None,
                       "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "##",
                                 "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                                 "ignore_merges": False, "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]}})


def test_a_rust_panic_in_the_tokenizers_library_is_one_line(models, tmp_path, capfd):
    """pyo3's PanicException is a BaseException (not an Exception) and the panic message is written on
    descriptor 2 by Rust itself: both kept to the one error line."""
    m = copy(models, "bert", tmp_path)
    (m / "tokenizer.json").write_text(bpe_panicking_tokenizer_json())
    r = experiment(m)
    line = one_error_line(r, str(m / "tokenizer.json"))
    assert "not a tokenizer the tokenizers library can read (PanicException" in line
    out, err = capfd.readouterr()
    assert "panicked" not in err and "backtrace" not in err, err
    g = copy(models, "llama", tmp_path)
    for f in ("tokenizer.json", "vocab.txt"):
        (g / f).unlink()
    edit_json(g / "tokenizer_config.json", tokenizer_class="GPT2Tokenizer")
    (g / "vocab.json").write_text(json.dumps({"a": 0, "b": 1}))
    (g / "merges.txt").write_text("a b\nzz q\n")
    r = experiment(g)
    assert "transformers cannot build a tokenizer from it (PanicException" in one_error_line(r, str(g / "vocab.json"))
    assert "panicked" not in capfd.readouterr().err



def test_oversized_tokenizer_files_are_refused_before_they_are_read(models, tmp_path):
    import time

    from qkinspect.loading.tokenizer_files import MAX_TOKENIZER_BYTES, MAX_VOCAB

    m = copy(models, "bert", tmp_path)
    with open(m / "tokenizer.json", "r+b") as f:  # sparse: its size, without the bytes
        f.truncate(MAX_TOKENIZER_BYTES + 1)
    t0 = time.perf_counter()
    one_error_line(experiment(m), f"{m / 'tokenizer.json'}: {MAX_TOKENIZER_BYTES + 1:,} bytes, more than")
    assert time.perf_counter() - t0 < 10
    (m / "tokenizer.json").unlink()
    (m / "vocab.txt").write_text("[UNK]\n" + "a\n" * MAX_VOCAB)
    one_error_line(experiment(m), f"{m / 'vocab.txt'}: {MAX_VOCAB + 1:,} tokens, more than a vocabulary has")



def test_vocab_txt_unknown_token_is_required_only_where_wordpiece_reads_it(models, tmp_path):
    """vocab.txt beside a tokenizer.json is not what the tokenizer is built from; special_tokens_map.json may name
    the unknown token."""
    m = copy(models, "bert", tmp_path)
    (m / "vocab.txt").write_text((m / "vocab.txt").read_text().replace("[UNK]", "<unk>"))
    r = experiment(m)  # tokenizer.json is there: vocab.txt is not read
    assert r.exit_code == 0, r.stderr
    (m / "tokenizer.json").unlink()
    one_error_line(experiment(m), "the vocabulary has no unknown token '[UNK]'")
    edit_json(m / "tokenizer_config.json", unk_token=None)
    (m / "special_tokens_map.json").write_text(json.dumps({"unk_token": "<unk>"}))
    r = experiment(m)
    assert r.exit_code == 0, r.stderr


# -- class 3: nothing but the one line on stderr, through the real executable --------------------------------


def test_real_executable_prints_no_progress_bar_and_no_transformers_line(models, tmp_path):
    """stderr a pipe: a GGUF run prints nothing there (transformers' GGUF loader has its own tqdm bar), and an
    unknown rope_type is one `error:` line (transformers logged a line of its own before it). Started together:
    each pays Python's and torch's start-up."""
    rope = copy(models, "llama", tmp_path)
    edit_json(rope / "config.json", rope_parameters={"rope_type": "nope", "rope_theta": 10000.0})
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), "HF_HUB_OFFLINE": "1"}
    runs = {name: subprocess.Popen([sys.executable, "-m", "qkinspect", "experiment", str(spec), *SMALL],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for name, spec in (("gguf", models["gguf"]), ("rope", rope))}
    out, err = runs["gguf"].communicate(timeout=300)
    assert runs["gguf"].returncode == 0 and quiet(err), err
    assert json.loads(out)["measure"]["kind"] == "causal"
    out, err = runs["rope"].communicate(timeout=300)
    assert runs["rope"].returncode == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {rope / 'config.json'}: rope_type 'nope'"), err


# -- class 4: nothing outside the model's folder is opened -----------------------------------------------------


@pytest.mark.parametrize("name", ["tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"])
def test_tokenizer_files_linking_out_of_the_folder_are_refused(models, tmp_path, name):
    m = copy(models, "bert", tmp_path)
    outside = tmp_path / f"outside-{name}"
    if (m / name).exists():
        (m / name).rename(outside)
    else:
        outside.write_text("{}")
    (m / name).symlink_to(outside)
    line = one_error_line(experiment(m), f"tokenizer file '{name}' is a link to {outside}")
    assert "outside the model folder" in line


OPENED: list[str] | None = None  # paths opened by Python code while a test records them


def _record_opens(event: str, args: tuple) -> None:
    if OPENED is not None and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_record_opens)  # audit hooks cannot be removed: this one records only while OPENED is a list


@pytest.mark.parametrize("name, text", [("generation_config.json", '{"bos_token_id": 1}'),
                                        ("adapter_config.json", "{}"), ("chat_template.jinja", "{{ x }}"),
                                        ("special_tokens_map.json", "{}"), ("added_tokens.json", "{}")])
def test_other_files_of_the_folder_are_never_opened(models, tmp_path, name, text):
    """Files of the folder that the run does not need, linked to a file outside it: never opened (Python's audit
    hook sees every open). transformers reads a private folder holding only the checked files it needs; a
    tokenizer file among them that links out is refused (the test above)."""
    global OPENED
    m = copy(models, "llama", tmp_path)
    outside = tmp_path / "outside"
    outside.write_text(text)
    if (m / name).exists():
        (m / name).unlink()
    (m / name).symlink_to(outside)
    if name in ("special_tokens_map.json", "added_tokens.json"):  # tokenizer files: refused, never opened
        (m / "tokenizer.json").unlink()
    OPENED = []
    try:
        r = experiment(m)
        opened = [p for p in OPENED if os.path.realpath(p) == str(outside.resolve())]
    finally:
        OPENED = None
    assert opened == []
    if name in ("special_tokens_map.json", "added_tokens.json"):
        one_error_line(r, f"tokenizer file '{name}' is a link to")
    else:
        assert r.exit_code == 0 and quiet(r.stderr), r.stderr


def test_a_tokenizer_file_that_is_a_fifo_is_refused(models, tmp_path):
    m = copy(models, "bert", tmp_path)
    (m / "tokenizer.json").unlink()
    os.mkfifo(m / "tokenizer.json")
    one_error_line(experiment(m), f"{m / 'tokenizer.json'}: is not a regular file")


def test_a_tokenizer_folder_follows_the_same_link_rules(models, tmp_path):
    tok = tmp_path / "tok"
    tiny.save_tokenizer(tok)
    (tok / "vocab.txt").rename(tmp_path / "vocab.txt")
    (tok / "vocab.txt").symlink_to(tmp_path / "vocab.txt")
    one_error_line(experiment(models["llama"], "--tokenizer", tok), "tokenizer file 'vocab.txt' is a link to")
    (tok / "vocab.txt").unlink()
    (tok / "vocab.txt").write_text("\n".join(tiny.VOCAB) + "\n")
    r = experiment(models["llama"], "--tokenizer", tok)
    assert r.exit_code == 0, r.stderr


def test_a_weight_file_named_beside_its_config_is_what_transformers_reads(models, tmp_path):
    """`experiment weights.safetensors`: the private folder holds that file as model.safetensors (transformers
    looked for model.safetensors in the folder, which may not exist or may be another file)."""
    m = copy(models, "llama", tmp_path)
    (m / "model.safetensors").rename(m / "weights.safetensors")
    r = experiment(m / "weights.safetensors")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["baseline"] == json.loads(experiment(models["llama"]).stdout)["baseline"]
