"""Turn a model spec (folder, file, hub id, GGUF, or nothing for the demo) into a config and a tensor source."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qkinspect.errors import CheckpointError, ModelNotFoundError
from qkinspect.loading.source import SafetensorsSource, TensorSource


@dataclass
class Resolved:
    name: str
    path: Path
    format: str
    config: Any  # transformers PretrainedConfig
    source: TensorSource
    revision: str | None = None


def load_config(folder: Path) -> Any:
    from transformers import AutoConfig

    cfg_file = folder / "config.json"
    if not cfg_file.is_file():
        raise ModelNotFoundError(f"{folder}: no config.json in this folder")
    try:
        raw = json.loads(cfg_file.read_text())
    except ValueError as e:
        raise CheckpointError(f"{cfg_file}: not valid JSON ({e})") from None
    model_type = raw.get("model_type")
    if not model_type:
        raise CheckpointError(f"{cfg_file}: no model_type")
    from qkinspect.loading.adapters.registry import adapter_for

    adapter_for(model_type)  # refuse unknown types before transformers tries to import remote code
    try:
        return AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
    except Exception as e:
        raise CheckpointError(f"{cfg_file}: transformers cannot read this config ({e})") from None


def folder_source(folder: Path) -> tuple[TensorSource, str]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return SafetensorsSource.from_index(index), "safetensors"
    single = folder / "model.safetensors"
    if single.is_file():
        return SafetensorsSource([single]), "safetensors"
    raise ModelNotFoundError(f"{folder}: no model.safetensors or model.safetensors.index.json")


def resolve(spec: str | Path | None, revision: str | None = None) -> Resolved:
    if spec is None:
        from qkinspect.demo import DEMO_NAME, demo_path

        folder = demo_path()
        print(f"note: no model given; using the bundled demo model {DEMO_NAME}", file=sys.stderr)
        source, fmt = folder_source(folder)
        return Resolved(DEMO_NAME, folder, fmt, load_config(folder), source)
    path = Path(spec).expanduser()
    if path.is_dir():
        source, fmt = folder_source(path)
        return Resolved(str(spec), path, fmt, load_config(path), source, revision)
    raise ModelNotFoundError(f"{spec}: no such file or folder")
