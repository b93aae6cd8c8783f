"""Hostile checkpoints (issue classes 1, 3 and 6): nothing outside the model folder is read, a checkpoint's
description is validated where it enters, and every refusal is one line naming the file (and the key)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from qkinspect.errors import CheckpointError, InputError, UnsupportedModelError
from qkinspect.loading import open_model
from qkinspect.loading.checked import inside
from tests.loading import tiny


@pytest.fixture(scope="module")
def bert_state():
    return tiny.bert()


def sharded(tmp_path: Path, bert_state, name="m") -> Path:
    config, state = bert_state
    return tiny.write(tmp_path / name, config, state, shards=2)


def edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def refused(spec, pattern: str, error=CheckpointError):
    with pytest.raises(error, match=pattern) as e:
        with open_model(spec) as m:
            list(m.layers())
    assert isinstance(e.value, InputError) and e.value.exit_code == 2
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.fixture
def opened_files(monkeypatch):
    """Every safetensors file the loader opens."""
    from qkinspect.loading import source

    seen: list[str] = []
    for opener in ("_open_safetensors", "read_safetensors_header"):  # the data, and the header alone
        real = getattr(source, opener)

        def spy(f, real=real):
            seen.append(os.path.realpath(f))
            return real(f)

        monkeypatch.setattr(source, opener, spy)
    return seen


# -- class 1: nothing outside the model folder is read ------------------------------------------------------


def _point_shard_at(folder: Path, target: str) -> None:
    index = folder / "model.safetensors.index.json"
    edit_json(index, lambda d: d["weight_map"].update({k: target for k, v in d["weight_map"].items()
                                                       if v.endswith("00002-of-00002.safetensors")}))


@pytest.mark.parametrize("target", ["../elsewhere/model-00002-of-00002.safetensors", "ABSOLUTE", "/etc/passwd",
                                    "sub/../../elsewhere/model-00002-of-00002.safetensors"])
def test_index_naming_a_file_outside_is_refused_before_opening_anything(tmp_path, bert_state, target,
                                                                       opened_files):
    folder = sharded(tmp_path, bert_state)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (folder / "model-00002-of-00002.safetensors").rename(outside / "model-00002-of-00002.safetensors")
    if target == "ABSOLUTE":
        target = str(outside / "model-00002-of-00002.safetensors")
    _point_shard_at(folder, target)
    msg = refused(folder, "model.safetensors.index.json: .*(outside the model folder|absolute path)")
    assert "refused" in msg
    assert opened_files == []  # refused before any shard was opened


def test_shard_link_to_a_file_outside_is_refused(tmp_path, bert_state, opened_files):
    folder = sharded(tmp_path, bert_state)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shard = folder / "model-00002-of-00002.safetensors"
    shard.rename(outside / shard.name)
    shard.symlink_to(outside / shard.name)
    refused(folder, f"shard 'model-00002-of-00002.safetensors' is a link to {outside}.* outside the model folder")
    assert opened_files == []


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_fixed_files_linking_outside_are_refused(tmp_path, bert_state, name):
    config, state = bert_state
    folder = tiny.write(tmp_path / "m", config, state)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (folder / name).rename(outside / name)
    (folder / name).symlink_to(outside / name)
    refused(folder, f"{name}' is a link to .*outside the model folder")


def test_links_inside_the_folder_are_followed(tmp_path, bert_state):
    folder = sharded(tmp_path, bert_state)
    (folder / "real").mkdir()
    shard = folder / "model-00002-of-00002.safetensors"
    shard.rename(folder / "real" / shard.name)
    shard.symlink_to(Path("real") / shard.name)
    with open_model(folder) as m:
        assert len(list(m.layers())) == 2


def hub_cache(tmp_path: Path, bert_state, shards: int = 2) -> Path:
    """The Hugging Face cache layout: snapshots/<rev>/<file> are relative links to ../../blobs/<hash>."""
    config, state = bert_state
    plain = tiny.write(tmp_path / "plain", config, state, shards=shards)
    repo = tmp_path / "hub" / "models--org--tiny"
    blobs, snap = repo / "blobs", repo / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for i, f in enumerate(sorted(plain.iterdir())):
        blob = blobs / f"{i:040x}"
        f.rename(blob)
        (snap / f.name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    return snap


def test_hub_cache_snapshot_links_into_blobs_work(tmp_path, bert_state):
    snap = hub_cache(tmp_path, bert_state)
    assert all((snap / n).is_symlink() for n in os.listdir(snap))
    with open_model(snap) as m:
        assert [layer.layer for layer in m.layers()] == [0, 1]


def test_hub_cache_snapshot_link_outside_the_repo_is_refused(tmp_path, bert_state):
    snap = hub_cache(tmp_path, bert_state)
    other = tmp_path / "hub" / "models--someone--else"
    other.mkdir()
    shard = snap / "model-00002-of-00002.safetensors"
    real = Path(os.path.realpath(shard))
    real.rename(other / "stolen")
    shard.unlink()
    shard.symlink_to(other / "stolen")
    refused(snap, "is a link to .*models--someone--else/stolen, outside the model folder")


def test_inside_refuses_what_is_not_a_file_name(tmp_path):
    for name in ["", 3, None, ["a"], "a\x00b"]:
        with pytest.raises(CheckpointError, match="index.json: names shard .* which is not a file name"):
            inside(tmp_path, name, tmp_path / "index.json", "shard")


# -- class 3: the description is validated where it enters --------------------------------------------------


def config_folder(tmp_path, bert_state, edit) -> Path:
    config, state = bert_state
    folder = tiny.write(tmp_path / "m", config, state)
    edit_json(folder / "config.json", edit)
    return folder


@pytest.mark.parametrize(("edit", "pattern"), [
    (lambda d: d.update(num_attention_heads=0), "config.json: num_attention_heads is 0; it must be at least 1"),
    (lambda d: d.update(num_attention_heads=-4), "config.json: num_attention_heads is -4"),
    (lambda d: d.update(hidden_size="32"), "config.json: hidden_size is '32' \\(string\\), not a whole number"),
    (lambda d: d.update(num_hidden_layers=2.0), "config.json: num_hidden_layers is 2.0 \\(number\\)"),
    (lambda d: d.update(num_hidden_layers=True), "config.json: num_hidden_layers is True"),
    (lambda d: d.update(num_attention_heads=None), "config.json: num_attention_heads is None"),
    (lambda d: d.update(num_key_value_heads=3), "num_attention_heads \\(4\\) is not a multiple of "
                                                "num_key_value_heads \\(3\\)"),
    (lambda d: d.update(model_type=["bert"]), "config.json: model_type is \\['bert'\\], not a string"),
    (lambda d: d.update(model_type={"a": 1}), "config.json: model_type is \\{'a': 1\\}, not a string"),
    (lambda d: d.update(text_config={"hidden_size": 0}), "config.json: text_config.hidden_size is 0"),
    # per-layer lists are built from the layer count: 2**40 layers would exhaust memory before any check
    (lambda d: d.update(num_hidden_layers=2**40), "config.json: num_hidden_layers is 1099511627776, more than any "
                                                  "model has \\(at most 1,048,576\\)"),
])
def test_config_values_are_checked_where_they_enter(tmp_path, bert_state, edit, pattern):
    refused(config_folder(tmp_path, bert_state, edit), pattern)


@pytest.mark.parametrize("file", ["config.json", "model.safetensors.index.json"])
def test_deeply_nested_json_is_refused(tmp_path, bert_state, file):
    folder = sharded(tmp_path, bert_state)
    text = (folder / file).read_text().rstrip().removesuffix("}")

    def nest(depth: int) -> str:
        return text + ', "deep": ' + "[" * depth + "]" * depth + "}"

    (folder / file).write_text(nest(100_000))  # past Python's recursion limit
    refused(folder, f"{file}: not valid JSON \\(nested too deeply\\)")
    (folder / file).write_text(nest(100))
    refused(folder, f"{file}: nested more than 64 levels deep")


@pytest.mark.parametrize(("weight_map", "pattern"), [
    ({"a": 3}, "weight_map\\['a'\\] is 3, not a file name"),
    ({"a": None}, "weight_map\\['a'\\] is None, not a file name"),
    ({"a": ["x.safetensors"]}, "weight_map\\['a'\\] is \\['x.safetensors'\\], not a file name"),
    (["x.safetensors"], "weight_map is not an object"),
    ("x", "weight_map is not an object"),
])
def test_index_values_are_checked(tmp_path, bert_state, weight_map, pattern):
    folder = sharded(tmp_path, bert_state)
    edit_json(folder / "model.safetensors.index.json", lambda d: d.update(weight_map=weight_map))
    refused(folder, f"model.safetensors.index.json: .*{pattern}")


def test_index_that_is_not_an_object(tmp_path, bert_state):
    folder = sharded(tmp_path, bert_state)
    (folder / "model.safetensors.index.json").write_text("[1, 2]")
    refused(folder, "model.safetensors.index.json: holds a JSON array, not an object")


@pytest.mark.parametrize("dtype", [torch.int32, torch.int8, torch.uint8, torch.bool])
def test_integer_projection_weights_are_refused(tmp_path, bert_state, dtype):
    config, state = bert_state
    state = dict(state)
    name = "encoder.layer.1.attention.self.key.weight"
    state[name] = (state[name] * 100).to(dtype)
    folder = tiny.write(tmp_path / "m", config, state)
    refused(folder, f"tensor 'encoder.layer.1.attention.self.key.weight' is stored as {str(dtype)[6:]}, not a "
                    f"floating-point type")


def gguf_with(tmp_path, **meta) -> Path:
    return tiny.llama_gguf_with(tmp_path / "m.gguf", **meta)


def test_gguf_with_true_metadata_opens(tmp_path):
    with open_model(gguf_with(tmp_path)) as m:
        assert len(list(m.layers())) == 2


@pytest.mark.parametrize(("meta", "pattern"), [
    ({"attention.head_count": 0}, "llama.attention.head_count is 0; it must be at least 1"),
    ({"attention.head_count": 3, "attention.head_count_kv": 3, "attention.key_length": None},
     "(not a multiple|transformers cannot build a config)"),
    ({"attention.head_count_kv": 3}, "num_attention_heads \\(4\\) is not a multiple of num_key_value_heads \\(3\\)"),
    ({"embedding_length": "64"}, "llama.embedding_length is '64', not a whole number"),
    ({"block_count": -1}, "llama.block_count is -1"),
    ({"attention.head_count": [4, 0]}, "llama.attention.head_count is 0"),
    ({"block_count": 2**40}, "llama.block_count is 1099511627776, more than any model has"),
])
def test_gguf_metadata_is_checked_where_it_enters(tmp_path, meta, pattern):
    refused(gguf_with(tmp_path, **meta), f"m.gguf: {pattern}")


@pytest.mark.parametrize("length", [2**40, 2**63, 4])
def test_gguf_array_claiming_more_than_the_file_holds_is_refused_at_once(tmp_path, length):
    """gguf's own reader returns empty parts past the end of the file: a huge array length looped for ever, growing
    memory by gigabytes a minute (found by the fuzz test). The reader used here refuses it at once."""
    import struct
    import time

    path = gguf_with(tmp_path, extra=[1, 2, 3])
    data = bytearray(path.read_bytes())
    at = data.index(b"llama.extra") + len(b"llama.extra") + 8  # past the key, the value type and the item type
    assert struct.unpack_from("<Q", data, at)[0] == 3
    struct.pack_into("<Q", data, at, length)
    if length == 4:  # one element more than written: the reader runs past the key/value section into the
        del data[at + 8:]  # tensor infos; cut the file there so that the fourth element is past the end
        data += struct.pack("<3i", 1, 2, 3)
    path.write_bytes(bytes(data))
    t0 = time.perf_counter()
    refused(path, "m.gguf: not a readable GGUF file, corrupt or truncated \\(")
    assert time.perf_counter() - t0 < 10


# -- class 6: messages say what is wrong with which file ----------------------------------------------------


def test_unknown_model_type_names_the_config(tmp_path, bert_state):
    folder = config_folder(tmp_path, bert_state, lambda d: d.update(model_type="no-such-arch"))
    refused(folder, f"{folder / 'config.json'}: model_type 'no-such-arch' is not supported", UnsupportedModelError)


def _deny(monkeypatch, victim: str):
    """Make opening files named `victim` fail as an unreadable file does (the tests run as root, where chmod
    000 does not stop a read)."""
    import builtins

    real_open, real_read = builtins.open, Path.read_text

    def guarded_open(file, *a, **kw):
        if str(file).endswith(victim):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *a, **kw)

    def guarded_read(self, *a, **kw):
        if str(self).endswith(victim):
            raise PermissionError(13, "Permission denied", str(self))
        return real_read(self, *a, **kw)

    real_os_open = os.open

    def guarded_os_open(file, *a, **kw):  # qkinspect.reading opens JSON files with os.open
        if str(file).endswith(victim):
            raise PermissionError(13, "Permission denied", str(file))
        return real_os_open(file, *a, **kw)

    monkeypatch.setattr(builtins, "open", guarded_open)
    monkeypatch.setattr(Path, "read_text", guarded_read)
    monkeypatch.setattr(os, "open", guarded_os_open)


def test_unreadable_config_says_permission_denied(tmp_path, bert_state, monkeypatch):
    config, state = bert_state
    folder = tiny.write(tmp_path / "m", config, state)
    _deny(monkeypatch, "config.json")
    msg = refused(folder, "config.json: cannot read it \\(Permission denied\\)")
    assert "JSON" not in msg


def test_unreadable_weights_say_permission_denied(tmp_path, bert_state, monkeypatch):
    config, state = bert_state
    folder = tiny.write(tmp_path / "m", config, state)

    def denied(f, **kw):
        raise PermissionError(13, "Permission denied", str(f))

    monkeypatch.setattr("safetensors.safe_open", denied)
    msg = refused(folder, "model.safetensors: cannot read it \\(Permission denied\\)")
    assert "missing" not in msg


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_files_for_real(tmp_path, bert_state):  # pragma: no cover - runs as a normal user only
    config, state = bert_state
    folder = tiny.write(tmp_path / "m", config, state)
    (folder / "model.safetensors").chmod(0)
    refused(folder, "model.safetensors: cannot read it \\(Permission denied\\)")
    (folder / "config.json").chmod(0)
    refused(folder, "config.json: cannot read it \\(Permission denied\\)")


def test_bin_index_is_checked_like_safetensors(tmp_path, bert_state):
    config, state = bert_state
    folder = tiny.write(tmp_path / "m", config, state, fmt="bin", shards=2)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    save_file({"x": torch.zeros(1)}, str(outside / "x.safetensors"))
    edit_json(folder / "pytorch_model.bin.index.json",
              lambda d: d["weight_map"].update({next(iter(d["weight_map"])): "../elsewhere/x.bin"}))
    refused(folder, "pytorch_model.bin.index.json: shard '../elsewhere/x.bin' is the path .* outside the model")
