"""Bad input: each case raises an InputError (exit code 2) with a one-line message, and writes nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from qkinspect.errors import CheckpointError, InputError, ModelNotFoundError, UnsupportedModelError
from qkinspect.loading import open_model
from tests.loading import tiny


class Evil:
    """Unpickling this would run a shell command that creates a marker file."""

    marker: Path

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def bert_folder(tmp_path, fmt="safetensors", **kw):
    config, state = tiny.bert(**kw)
    return tiny.write(tmp_path / "m", config, state, fmt=fmt), state


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def case_missing_path(tmp_path):
    return tmp_path / "nowhere", ModelNotFoundError, "no such file or folder"


def case_no_config(tmp_path):
    folder, _ = bert_folder(tmp_path)
    (folder / "config.json").unlink()
    return folder, ModelNotFoundError, "no config.json"


def case_no_weights(tmp_path):
    folder, _ = bert_folder(tmp_path)
    (folder / "model.safetensors").unlink()
    return folder, ModelNotFoundError, "no weights"


def case_unknown_model_type(tmp_path):
    folder, _ = bert_folder(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "no-such-arch"}))
    return folder, UnsupportedModelError, "supported: .*bert"


def case_truncated_safetensors(tmp_path):
    folder, _ = bert_folder(tmp_path)
    truncate(folder / "model.safetensors")
    return folder, CheckpointError, "model.safetensors: not a readable safetensors file"


def case_corrupt_safetensors_header(tmp_path):
    folder, _ = bert_folder(tmp_path)
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[8:20] = b"\x00garbage!!\xff\xfe"
    (folder / "model.safetensors").write_bytes(bytes(data))
    return folder, CheckpointError, "model.safetensors: not a readable safetensors file"


def case_truncated_shard(tmp_path):
    config, state = tiny.bert()
    folder = tiny.write(tmp_path / "m", config, state, shards=2)
    truncate(folder / "model-00002-of-00002.safetensors")
    return folder, CheckpointError, "model-00002-of-00002.safetensors: not a readable"


def case_missing_shard(tmp_path):
    config, state = tiny.bert()
    folder = tiny.write(tmp_path / "m", config, state, shards=2)
    (folder / "model-00002-of-00002.safetensors").unlink()
    return folder, CheckpointError, "lists shard model-00002-of-00002.safetensors, which is missing"


def case_missing_tensor(tmp_path):
    config, state = tiny.bert()
    del state["encoder.layer.1.attention.self.key.weight"]
    return tiny.write(tmp_path / "m", config, state), CheckpointError, \
        r"'encoder.layer.1.attention.self.key.weight' is missing \(encoder layer 1\)"


def case_wrong_shape(tmp_path):
    config, state = tiny.bert()
    state["encoder.layer.1.attention.self.value.weight"] = torch.zeros(32, 30)
    return tiny.write(tmp_path / "m", config, state, fmt="bin"), CheckpointError, \
        r"'encoder.layer.1.attention.self.value.weight' has shape \(32, 30\), but the config implies \(32, 32\)"


def case_unreadable_bin(tmp_path):
    folder, _ = bert_folder(tmp_path, fmt="bin")
    truncate(folder / "pytorch_model.bin")
    return folder, CheckpointError, "pytorch_model.bin: not a readable PyTorch checkpoint"


def case_garbage_bin(tmp_path):
    folder, _ = bert_folder(tmp_path, fmt="bin")
    (folder / "pytorch_model.bin").write_bytes(b"this is not a checkpoint\n" * 20)
    return folder, CheckpointError, "pytorch_model.bin: not a readable PyTorch checkpoint"


def case_bin_needing_pickle_code(tmp_path):
    folder, state = bert_folder(tmp_path, fmt="bin")
    Evil.marker = tmp_path / "pwned"
    torch.save({**state, "payload": Evil()}, folder / "pytorch_model.bin")
    return folder, CheckpointError, r"refused: loading it would need pickle code \(posix.system\)"


def case_unsupported_file(tmp_path):
    folder, _ = bert_folder(tmp_path)
    return folder / "config.json", UnsupportedModelError, "unsupported file type"


def case_weights_file_without_config(tmp_path):
    folder, _ = bert_folder(tmp_path)
    (folder / "config.json").unlink()
    return folder / "model.safetensors", ModelNotFoundError, "no config.json beside this file"


def case_config_not_json(tmp_path):
    folder, _ = bert_folder(tmp_path)
    (folder / "config.json").write_text("{not json")
    return folder, CheckpointError, "not valid JSON"


CASES = [v for k, v in dict(globals()).items() if k.startswith("case_")]


@pytest.mark.parametrize("case", CASES, ids=lambda f: f.__name__[5:])
def test_bad_input_one_line_no_writes(tmp_path, case):
    spec, error, pattern = case(tmp_path)
    before = tiny.tree(tmp_path)
    with pytest.raises(error, match=pattern) as e:
        with open_model(spec) as m:
            list(m.layers())
    assert isinstance(e.value, InputError) and e.value.exit_code == 2
    assert "\n" not in str(e.value)
    assert tiny.tree(tmp_path) == before  # nothing written, nothing touched; no pickle payload ran


@pytest.mark.parametrize("case", [case_missing_path, case_truncated_safetensors, case_bin_needing_pickle_code],
                         ids=lambda f: f.__name__[5:])
def test_cli_reports_one_line_exit_2(tmp_path, case):
    from qkinspect.cli.app import app

    spec, _, _ = case(tmp_path)
    r = CliRunner().invoke(app, ["info", str(spec)])
    assert r.exit_code == 2, r.output
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("error: ")


def test_trust_remote_code_is_refused(tmp_path):
    folder, _ = bert_folder(tmp_path)
    with pytest.raises(InputError, match="trust_remote_code"):
        open_model(folder, trust_remote_code=True)
