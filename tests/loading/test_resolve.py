"""Model specs: folders, single files, sharded checkpoints, hub ids through a fake offline cache, the demo."""

from __future__ import annotations

import pytest
import torch

from qkinspect.errors import InputError, ModelNotFoundError
from qkinspect.loading import open_model
from qkinspect.loading.resolve import HUB_PATTERNS, hub_cache_dir, is_hub_id, resolve
from tests.loading import tiny

SHA = "0123456789abcdef0123456789abcdef01234567"
SHA2 = "fedcba9876543210fedcba9876543210fedcba98"


def q_weight(spec, layer=0, **kw):
    with open_model(spec, **kw) as m:
        return m.info, m.layer("encoder", layer).W_Q


def expected_q(state, layer=0, heads=4):
    w = state[f"encoder.layer.{layer}.attention.self.query.weight"]  # (H*d, D) [out, in]
    return w.reshape(heads, -1, w.shape[1]).transpose(1, 2)  # (H, d, D) -> (H, D, d)


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
@pytest.mark.parametrize("shards", [1, 2])
def test_folder_formats_read_the_same_matrices(tmp_path, fmt, shards):
    config, state = tiny.bert()
    folder = tiny.write(tmp_path / "m", config, state, fmt=fmt, shards=shards)
    info, W_Q = q_weight(folder, layer=1)
    assert info.format == fmt
    assert torch.equal(W_Q, expected_q(state, 1))


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_single_file_beside_config(tmp_path, fmt):
    config, state = tiny.bert()
    folder = tiny.write(tmp_path / "m", config, state, fmt=fmt)
    file = folder / ("model.safetensors" if fmt == "safetensors" else "pytorch_model.bin")
    info, W_Q = q_weight(file)
    assert (info.format, info.source) == (fmt, str(file))
    assert torch.equal(W_Q, expected_q(state))


def test_safetensors_preferred_over_bin(tmp_path):
    config, state = tiny.bert(seed=0)
    _, other = tiny.bert(seed=1)
    folder = tiny.write(tmp_path / "m", config, state, fmt="safetensors")
    tiny.write(folder, config, other, fmt="bin")  # different weights in the .bin: must not be the ones read
    info, W_Q = q_weight(folder)
    assert info.format == "safetensors"
    assert torch.equal(W_Q, expected_q(state))


def test_prefixed_names_are_found(tmp_path):
    config, state = tiny.bert()
    folder = tiny.write(tmp_path / "m", config, state, fmt="bin", prefix="bert.")
    assert torch.equal(q_weight(folder)[1], expected_q(state))


def test_demo_when_no_spec(capsys):
    r = resolve(None)
    assert r.config.model_type == "bert" and r.format == "safetensors"
    assert "demo" in capsys.readouterr().err


# -- hub ids ------------------------------------------------------------------------------------------------


def fake_hub_model(cache, repo="org/name", sha=SHA, ref="main", seed=0):
    """The layout huggingface_hub writes: models--org--name/{snapshots/<sha>/..., refs/<ref>}."""
    root = cache / f"models--{repo.replace('/', '--')}"
    config, state = tiny.bert(seed=seed)
    tiny.write(root / "snapshots" / sha, config, state)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / ref).write_text(sha)
    return state


def test_hub_id_from_hf_home_cache_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    state = fake_hub_model(tmp_path / "home" / "hub")
    info, W_Q = q_weight("org/name")
    assert (info.name, info.revision) == ("org/name", SHA)
    assert info.source == str(tmp_path / "home" / "hub" / "models--org--name" / "snapshots" / SHA)
    assert torch.equal(W_Q, expected_q(state))


def test_hub_cache_env_wins_and_revision_selects_snapshot(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    fake_hub_model(tmp_path / "cache", sha=SHA, seed=0)
    state2 = fake_hub_model(tmp_path / "cache", sha=SHA2, ref="v2", seed=1)
    assert hub_cache_dir() == tmp_path / "cache"
    for revision in ("v2", SHA2):
        info, W_Q = q_weight("org/name", revision=revision)
        assert info.revision == SHA2
        assert torch.equal(W_Q, expected_q(state2))


def test_hub_unreachable_falls_back_to_cache(tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE")  # online, but HF_ENDPOINT (conftest) refuses every connection
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the library read the variable at import
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    state = fake_hub_model(tmp_path / "cache")
    real, calls = huggingface_hub.snapshot_download, []

    def spy(**kw):
        calls.append(kw.get("local_files_only", False))
        return real(**kw)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", spy)
    assert torch.equal(q_weight("org/name")[1], expected_q(state))
    assert calls[0] is False  # the hub was tried first


@pytest.mark.parametrize("offline", [True, False])
def test_hub_id_not_cached_is_model_not_found(tmp_path, monkeypatch, offline):
    if not offline:
        monkeypatch.delenv("HF_HUB_OFFLINE")
    with pytest.raises(ModelNotFoundError, match="not in the Hugging Face cache") as e:
        resolve("org/absent")
    assert "\n" not in str(e.value)
    assert ("HF_HUB_OFFLINE" in str(e.value)) == offline


def test_hub_revision_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    fake_hub_model(tmp_path / "cache")
    with pytest.raises(ModelNotFoundError, match="revision v9"):
        resolve("org/name", revision="v9")


def test_hub_download_is_limited_to_config_and_weights(tmp_path, monkeypatch):
    """Online, snapshot_download is asked for the config and weights only, in the cache the environment names."""
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    calls = []

    def fake_download(**kw):
        calls.append(kw)
        return str(fake_hub_model(tmp_path / "cache") and tmp_path / "cache/models--org--name/snapshots" / SHA)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    info, _ = q_weight("org/name", revision="main")
    assert len(calls) == 1 and not calls[0].get("local_files_only")
    assert calls[0]["allow_patterns"] == HUB_PATTERNS and calls[0]["revision"] == "main"
    assert calls[0]["cache_dir"] == tmp_path / "cache"
    assert info.revision == SHA


@pytest.mark.parametrize(("spec", "hub"), [
    ("org/name", True), ("Org-1/name_2.v3", True), ("./org/name", False), ("/abs/path", False),
    ("~/x/y", False), ("org/name.safetensors", False), ("org/model.gguf", False), ("a/b/c", False), ("bare", False),
])
def test_is_hub_id(spec, hub):
    assert is_hub_id(spec) == hub


@pytest.mark.parametrize("where, name", [
    ("my-bert", "my-bert"), ("runs/my-bert/model", "my-bert"),
    ("hub/models--org--some-bert/snapshots/0123abc", "org/some-bert"),
])
def test_a_model_is_named_by_its_folder_not_its_path(tmp_path, where, name):
    config, state = tiny.bert()
    folder = tiny.write(tmp_path / where, config, state)
    with open_model(str(folder)) as m:
        assert (m.info.name, m.info.source) == (name, str(folder))
    with open_model(str(folder / "model.safetensors")) as m:  # save_pretrained's file name: the folder's name
        assert m.info.name == name


def test_a_gguf_file_is_named_by_its_metadata(tmp_path):
    import gguf

    config, state = tiny.llama()
    path = tiny.write_gguf(tmp_path / "x.Q8_0.gguf", config, state)
    with open_model(str(path)) as m:
        assert m.info.name == "x.Q8_0"  # no general.name: the file's stem
    reader = gguf.GGUFReader(str(path))
    assert "general.name" not in reader.fields
    named = tmp_path / "named.gguf"
    tiny.write_gguf(named, config, state, name="  Tiny   Llama 1B ")
    with open_model(str(named)) as m:
        assert (m.info.name, m.info.source) == ("Tiny Llama 1B", str(named))


@pytest.mark.parametrize("ref", ["../../../elsewhere", "../../models--org--other/snapshots/" + "b" * 40,
                                 "/etc", "a" * 39, "main"])
def test_hub_refs_leading_out_of_the_repo_are_refused(tmp_path, monkeypatch, ref):
    """refs/main is read by huggingface_hub and joined to snapshots/ as it is: a path out of the repo's cache
    folder (or anything but a commit hash) is refused before any file in it is read."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    fake_hub_model(tmp_path / "cache")
    fake_hub_model(tmp_path / "cache", repo="org/other", sha="b" * 40)
    (tmp_path / "elsewhere").mkdir()
    if "/" not in ref:  # a name that is no commit hash, as a folder in snapshots/
        (tmp_path / "cache" / "models--org--name" / "snapshots" / ref).mkdir()
    (tmp_path / "cache" / "models--org--name" / "refs" / "main").write_text(ref)
    with pytest.raises(InputError, match=r"refs/main: leads to .* not a snapshot of org/name"):
        resolve("org/name")


def test_hub_snapshot_that_links_out_of_the_repo_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    fake_hub_model(tmp_path / "cache", repo="org/other", sha="b" * 40)
    snaps = tmp_path / "cache" / "models--org--name" / "snapshots"
    snaps.mkdir(parents=True)
    (snaps / SHA).symlink_to(tmp_path / "cache" / "models--org--other" / "snapshots" / ("b" * 40))
    (snaps.parent / "refs").mkdir()
    (snaps.parent / "refs" / "main").write_text(SHA)
    with pytest.raises(InputError, match="outside the cache folder"):
        resolve("org/name")
