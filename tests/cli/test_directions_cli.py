"""`qkinspect directions`: formats, the 80-column table, the PDF page, and bad input as one line with exit 2."""

from __future__ import annotations

import csv
import io
import json
import os

import pytest
import torch
from rich.cells import cell_len

from tests.one_line import one_error_line

V = 60


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=16, tie_word_embeddings=False)
    folder = tmp_path_factory.mktemp("lm")
    LlamaForCausalLM(cfg).eval().save_pretrained(folder, safe_serialization=True)
    return folder


def copy_of(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_json_ndjson_and_csv_carry_every_record(cli, lm, tmp_path):
    r = cli("directions", lm, "--layers", "1", "--heads", "2", "-k", "2", "-n", "3", "--format", "json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "qkinspect/1" and doc["kind"] == "directions"
    rows = doc["directions"]
    assert {(x["matrix"], x["side"]) for x in rows} == {("ov", "read"), ("ov", "write"), ("qk", "query"),
                                                        ("qk", "key")}
    assert all(x["layer"] == 1 and x["head"] == 2 and x["kv_head"] == 1 and len(x["token_ids"]) == 3 for x in rows)
    assert doc["readout"]["unembedding"] == "lm_head.weight" and doc["readout"]["tied"] is False
    r = cli("directions", lm, "--layers", "1", "--heads", "2", "-k", "2", "-n", "3", "--format", "ndjson")
    assert [json.loads(line) for line in r.stdout.splitlines()] == rows
    out = tmp_path / "d.csv"
    r = cli("directions", lm, "--layers", "1", "--heads", "2", "-k", "2", "-n", "3", "-o", out)
    assert r.exit_code == 0, r.stderr
    table = list(csv.DictReader(io.StringIO(out.read_text())))
    assert len(table) == len(rows) and json.loads(table[0]["token_ids"]) == rows[0]["token_ids"]


def test_the_table_fits_80_columns_and_shows_whitespace_tokens(monkeypatch):
    import qkinspect
    from qkinspect.cli.commands.directions import directions_document
    from qkinspect.cli.output import render_text

    result = qkinspect.directions(None, layers="0", heads="0-1", top_directions=2, top_tokens=10)
    text = render_text(directions_document(result), width=80)
    assert max(cell_len(line) for line in text.splitlines()) <= 80
    assert "encoder layer 0 head 1 (KV head 1)" in text and "OV write" in text and "QK key" in text


def test_printable_makes_whitespace_and_control_characters_visible():
    from qkinspect.loading.tokens import printable

    assert printable(" the") == "␣the"
    assert printable("\n\t") == "\\n\\t"
    assert printable("\x00\u200b") == "\\x00\\u200b"
    assert printable(None) == "∅" and printable("") == '""'


def test_the_pdf_page_is_written(cli, lm, tmp_path):
    pdf = tmp_path / "d.pdf"
    r = cli("directions", lm, "--layers", "0", "--heads", "0", "-k", "1", "--format", "json", "--pdf", pdf)
    assert r.exit_code == 0, r.stderr
    assert pdf.read_bytes().startswith(b"%PDF") and "wrote a 1-page PDF" in r.stderr


def test_no_embedding_tensor_is_one_line(cli, lm, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = copy_of(lm, tmp_path / "m")
    sd = load_file(folder / "model.safetensors")
    del sd["model.embed_tokens.weight"]
    save_file(sd, folder / "model.safetensors")
    one_error_line(cli("directions", folder, "--format", "json"), "no token embedding tensor", "embed_tokens")


def test_a_vocab_size_that_disagrees_is_one_line(cli, lm, tmp_path):
    folder = copy_of(lm, tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["vocab_size"] = V + 5
    (folder / "config.json").write_text(json.dumps(cfg))
    one_error_line(cli("directions", folder, "--format", "json"), "vocab_size", f"{V + 5}")


def test_a_tokenizer_larger_than_the_embedding_is_one_line(cli, lm, tmp_path):
    folder = copy_of(lm, tmp_path / "m")
    (folder / "vocab.txt").write_text("\n".join(f"t{i}" for i in range(V + 10)) + "\n")
    one_error_line(cli("directions", folder, "--format", "json"), "vocab.txt", "does not belong")


@pytest.mark.parametrize("content,says", [
    (b'{"model": 5}', "not a tokenizer the tokenizers library can read"),
    (b"\xff\xfe not text", "not UTF-8"),
    (b"[" * 100000, "not a tokenizer the tokenizers library can read"),
])
def test_a_hostile_tokenizer_json_is_one_line(cli, lm, tmp_path, content, says):
    folder = copy_of(lm, tmp_path / "m")
    (folder / "tokenizer.json").write_bytes(content)
    one_error_line(cli("directions", folder, "--format", "json"), "tokenizer.json", says)


def test_a_tokenizer_linked_from_outside_is_refused(cli, lm, tmp_path):
    folder = copy_of(lm, tmp_path / "m")
    outside = tmp_path / "elsewhere.json"
    outside.write_text("{}")
    os.symlink(outside, folder / "tokenizer.json")
    one_error_line(cli("directions", folder, "--format", "json"), "outside the model folder")


def test_bad_options_are_one_line(cli, lm, tmp_path):
    one_error_line(cli("directions", lm, "--top-directions", "0"), "--top-directions")
    one_error_line(cli("directions", lm, "--heads", "9"), "--heads")
    one_error_line(cli("directions", lm, "--pdf", tmp_path / "x.txt"), "--pdf")
    one_error_line(cli("directions", lm, "--format", "parquet"), "parquet")


def test_an_unmapped_family_is_one_line(cli, tmp_path):
    from transformers import T5Config, T5Model

    T5Model(T5Config(vocab_size=40, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=4)).save_pretrained(
        tmp_path / "t5", safe_serialization=True)
    one_error_line(cli("directions", tmp_path / "t5", "--format", "json"), "t5", "not mapped")


def test_parquet_holds_the_records(cli, lm, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "d.parquet"
    r = cli("directions", lm, "--layers", "0", "--heads", "1", "-k", "1", "-n", "2", "-o", out)
    assert r.exit_code == 0, r.stderr
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == 8 and {x["side"] for x in rows} == {"read", "write", "query", "key"}
    assert all(len(x["token_ids"]) == 2 and x["kv_head"] == 0 for x in rows)


def test_the_document_follows_the_published_schema(cli, lm):
    import jsonschema

    from tests.cli.schema import validate

    doc = json.loads(cli("directions", lm, "--layers", "0", "-k", "2", "-n", "2", "--format", "json").stdout)
    validate(doc)
    doc["directions"][0]["sign"] = "plus"
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)


def test_a_gguf_token_list_longer_than_its_embedding_is_one_line(cli, tmp_path):
    from tests.experiment import tiny_gguf

    path = tiny_gguf.llama_gguf(tmp_path / "m.gguf", tokens=[*tiny_gguf.byte_tokens(), "extra1", "extra2"])
    one_error_line(cli("directions", path, "--format", "json"), "tokenizer.ggml.tokens", "does not belong")


def test_sigma_is_the_ov_spectrum_that_analyze_reports():
    import qkinspect

    res = qkinspect.directions(None, layers="2", heads="4", top_directions=4, top_tokens=1, precision="float64")
    spectrum = qkinspect.analyze(None, layers="2", heads="4", metrics=["ov"], spectra=["ov", "qk"],
                                 precision="float64").spectra[("encoder", 2, 4)]
    for matrix in ("ov", "qk"):
        sig = {i: s for r in res.records if r.matrix == matrix for i, s in zip(r.indices, r.sigmas, strict=True)}
        assert [sig[i] for i in sorted(sig)] == pytest.approx(list(spectrum[matrix][:len(sig)]), rel=1e-9)


@pytest.mark.parametrize("style", ["byte-level", "sentencepiece"])
def test_a_folder_tokenizer_json_gives_the_text_of_each_token(lm, tmp_path, style):
    from tokenizers import Tokenizer, decoders, models

    import qkinspect

    folder = copy_of(lm, tmp_path / "m")
    if style == "byte-level":
        raw = ["Ġthe", "Ċ", "a", *(f"t{i}" for i in range(V - 3))]
        want = {0: " the", 1: "\n", 2: "a"}
        tok = Tokenizer(models.BPE({t: i for i, t in enumerate(raw)}, []))
        tok.decoder = decoders.ByteLevel()
    else:
        raw = ["▁the", "<0x0A>", "a", *(f"t{i}" for i in range(V - 3))]
        want = {0: " the", 1: "\n", 2: "a"}
        tok = Tokenizer(models.BPE({t: i for i, t in enumerate(raw)}, [], byte_fallback=True))
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    (folder / "tokenizer.json").write_text(tok.to_str())
    res = qkinspect.directions(folder, top_directions=1, top_tokens=V)
    assert res.readout.tokenizer_size == V
    rec = res.records[0]
    text = dict(zip(rec.token_ids, rec.tokens, strict=True))
    assert {i: text[i] for i in want} == want


def test_a_gguf_token_list_of_numbers_is_one_line(cli, tmp_path):
    from tests.experiment import tiny_gguf

    path = tiny_gguf.llama_gguf(tmp_path / "m.gguf", tokens=list(range(len(tiny_gguf.byte_tokens()))))
    one_error_line(cli("directions", path, "--format", "json"), "tokenizer.ggml.tokens", "not an array of strings")
