"""The JSON documents follow docs/qkinspect-1.schema.json, and the schema is strict enough to catch mistakes."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest
from safetensors import safe_open

from tests.cli.schema import validate


def test_info_document_is_valid(cli, tiny_bert):
    validate(json.loads(cli("info", tiny_bert, "-f", "json").stdout))


def test_extract_metadata_is_valid(cli, tiny_bert, tmp_path):
    out = tmp_path / "h.safetensors"
    assert cli("extract", tiny_bert, "-o", out).exit_code == 0
    with safe_open(str(out), "pt") as f:
        validate(json.loads(f.metadata()["qkinspect"]))


@pytest.mark.parametrize("break_it", [
    lambda d: d.update(schema="qkinspect/2"),
    lambda d: d.pop("model"),
    lambda d: d["model"]["blocks"][0].update(n_heads="4"),
    lambda d: d["model"].update(format="onnx"),
    lambda d: d.update(kind="other"),
])
def test_schema_rejects_broken_documents(cli, tiny_bert, break_it):
    doc = json.loads(cli("info", tiny_bert, "-f", "json").stdout)
    bad = copy.deepcopy(doc)
    break_it(bad)
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
