"""The published JSON Schema of qkinspect/1 (docs/qkinspect-1.schema.json) as a validator for tests."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "docs" / "qkinspect-1.schema.json"


@lru_cache(maxsize=1)
def validator():
    import jsonschema

    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def validate(doc: dict) -> dict:
    """Raise jsonschema.ValidationError when `doc` breaks the schema; return it otherwise."""
    validator().validate(doc)
    return doc
