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


def _documented_example() -> dict:
    import re

    from tests.cli.schema import SCHEMA_FILE

    text = (SCHEMA_FILE.parent / "output.md").read_text()
    (example,) = re.findall(r"```json\n(.*?)\n```", text, flags=re.S)
    return json.loads(example)


def test_documented_example_is_valid():
    doc = validate(_documented_example())
    assert doc["kind"] == "analyze" and doc["heads"][0]["symmetry"] is not None


def test_documented_example_is_real_output(cli):
    doc = _documented_example()
    now = json.loads(cli("analyze", "--layers", "0", "--heads", "0", "--metrics", "symmetry", "-f", "json").stdout)
    assert now["heads"] == [pytest.approx(h) for h in doc["heads"]]
    assert now["processing"] == doc["processing"] and now["model"]["blocks"] == doc["model"]["blocks"]
