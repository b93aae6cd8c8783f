"""Turn a model spec (folder, file, hub id, GGUF, or nothing for the demo) into a config and a tensor source.

Specs, tried in this order (docs/loading.md):
    None                    the bundled demo model
    an existing folder      config.json + weights (safetensors preferred over .bin; sharded via *.index.json)
    an existing file        .safetensors or .bin beside a config.json; or a .gguf (config from its metadata)
    ``org/name``            a Hugging Face hub id, through huggingface_hub (local cache when offline)
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qkinspect.errors import CheckpointError, ModelNotFoundError, UnsupportedModelError
from qkinspect.loading.checked import check_counts, check_names, inside, read_json
from qkinspect.loading.source import SafetensorsSource, TensorSource

# What a snapshot download fetches: the config and the weights, nothing else.
HUB_PATTERNS = ["config.json", "*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json"]
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".json", ".pt", ".pth")
_BARE_NAME = re.compile(r"[A-Za-z0-9][\w.-]*")  # a hub name without its org ("bert-base-uncased"): no path in it


@dataclass
class Resolved:
    name: str
    path: Path
    format: str  # "safetensors", "bin" or "gguf"
    config: Any  # a LightConfig, or a transformers PretrainedConfig (GGUF, families without light rules)
    source: TensorSource
    revision: str | None = None
    origin: str | None = None  # ModelInfo.source when not the path: "memory:<name>" (loading.in_memory)
    architecture: str | None = None  # the model's class, where config.architectures does not say it
    model: Any = None  # an in-memory transformers model (loading.in_memory), else None


def resolve(spec: str | Path | None, revision: str | None = None) -> Resolved:
    """Resolve a model spec without reading any weights.

    Raises:
        ModelNotFoundError: nothing is found under that spec (path, hub id, cache).
        UnsupportedModelError: the config's model_type, the file type or the GGUF architecture is not supported.
        CheckpointError: a config or weight file is corrupt, truncated or unsafe.

    Example:
        >>> r = resolve("path/to/bert")  # doctest: +SKIP
        >>> r.format, r.config.model_type  # doctest: +SKIP
        ('safetensors', 'bert')
    """
    if spec is None:
        from qkinspect.demo import DEMO_NAME, demo_path

        folder = demo_path()
        print(f"note: no model given; using the bundled demo model {DEMO_NAME}", file=sys.stderr)
        return _from_folder(DEMO_NAME, folder)
    path = Path(spec).expanduser()
    if path.is_dir():
        return _from_folder(folder_name(path), path, revision)
    if path.is_file():
        return _from_file(file_name(path), path)
    if is_hub_id(str(spec)):
        folder = hub_snapshot(str(spec), revision)
        return _from_folder(str(spec), folder, revision=folder.name)
    hint = ("; a Hugging Face hub id is written org/name (google-bert/bert-base-uncased)"
            if _BARE_NAME.fullmatch(str(spec)) and not str(spec).lower().endswith(_WEIGHT_SUFFIXES) else "")
    raise ModelNotFoundError(f"{spec}: no such file or folder{hint}")


def _from_folder(name: str, folder: Path, revision: str | None = None) -> Resolved:
    config = load_config(folder)  # first: refuses a folder without config.json or with an unknown model_type
    source, fmt = folder_source(folder)
    return Resolved(name, folder, fmt, config, _dequantizing(source, folder), revision)


def _dequantizing(source: TensorSource, folder: Path) -> TensorSource:
    """The source, dequantizing on read where config.json declares a quantization (already checked to be one
    qkinspect understands)."""
    from qkinspect.loading.quantized import check_quantization, dequantizing

    cfg_file = folder / "config.json"
    return dequantizing(source, check_quantization(read_json(cfg_file), cfg_file), cfg_file)


def _from_file(name: str, path: Path) -> Resolved:
    suffix = path.suffix.lower()
    if suffix == ".gguf":
        from qkinspect.loading.gguf import open_gguf

        config, source = open_gguf(path)
        return Resolved(source.metadata("general.name") or name, path, "gguf", config, source)
    if suffix not in (".safetensors", ".bin"):
        raise UnsupportedModelError(f"{path}: unsupported file type; give a folder, or a .safetensors, .bin or "
                                    f".gguf file")
    if not (path.parent / "config.json").is_file():
        raise ModelNotFoundError(f"{path}: no config.json beside this file")
    config = load_config(path.parent)
    if suffix == ".safetensors":
        return Resolved(name, path, "safetensors", config, _dequantizing(SafetensorsSource([path]), path.parent))
    return Resolved(name, path, "bin", config, _torchbin()([path]))


_STANDARD_FILES = ("model.safetensors", "pytorch_model.bin")
_GENERIC_FOLDERS = ("model", "models", "weights", "checkpoint", "ckpt", "hf", "final")
_HUB_CACHE_DIR = re.compile(r"models--(.+)")


def folder_name(folder: Path) -> str:
    """A model folder's name for titles: the folder's own name (its parent's when it is a generic `model`,
    `weights` …), or `org/name` for a snapshot in the Hugging Face cache (…/models--org--name/snapshots/<commit>).
    The path itself stays in ModelInfo.source. The demo model's folder is named as the demo (all-MiniLM-L6-v2),
    whether it is given by path or not at all.

    config.json's `_name_or_path` is not used: it names the checkpoint a model was loaded from before it was
    saved, which for a fine-tune is its base (all-MiniLM-L6-v2's says nreimers/MiniLM-L6-H384-uncased).
    """
    folder = folder.resolve()
    if _is_demo(folder):  # the demo by path has the name it has without a model argument
        from qkinspect.demo import DEMO_NAME

        return DEMO_NAME
    if folder.parent.name == "snapshots" and (m := _HUB_CACHE_DIR.fullmatch(folder.parent.parent.name)):
        return m.group(1).replace("--", "/")
    if folder.name.lower() in _GENERIC_FOLDERS and folder.parent.name:
        return folder.parent.name
    return folder.name or str(folder)


def _is_demo(folder: Path) -> bool:
    """Whether `folder` (resolved) is the bundled demo model's folder (qkinspect.demo), when that is installed."""
    from qkinspect.demo import demo_path
    from qkinspect.errors import DemoNotInstalledError

    try:
        return folder == demo_path().resolve()
    except DemoNotInstalledError:
        return False


def file_name(path: Path) -> str:
    """A weight file's name for titles: its stem, or its folder's name for a file named as save_pretrained names
    it (`model.safetensors`, `pytorch_model.bin`); a GGUF file's own `general.name` wins over both (_from_file)."""
    return folder_name(path.parent) if path.name in _STANDARD_FILES else path.stem


def load_config(folder: Path) -> Any:
    """The folder's config.json as the adapters read it; its model_type must have an adapter (no remote code).

    A `LightConfig` answers from the JSON what it can answer exactly as transformers would, and builds the
    transformers config only for the rest (qkinspect.loading.config): opening a model need not import it.
    """
    cfg_file = folder / "config.json"
    if not cfg_file.is_file():
        raise ModelNotFoundError(f"{folder}: no config.json in this folder")
    raw = read_json(inside(folder, cfg_file.name, folder))  # checked once, here: nothing later re-reads it raw
    model_type = raw.get("model_type")
    if model_type is None or model_type == "":
        raise CheckpointError(f"{cfg_file}: no model_type")
    if type(model_type) is not str:
        raise CheckpointError(f"{cfg_file}: model_type is {model_type!r}, not a string")
    check_counts(raw, cfg_file)
    check_names(raw, cfg_file)
    from qkinspect.loading.adapters.registry import adapter_for

    try:
        adapter_for(model_type)  # refuse unknown types before transformers tries to import remote code
    except UnsupportedModelError as e:
        raise UnsupportedModelError(f"{cfg_file}: {e}") from None
    from qkinspect.loading.quantized import check_quantization

    check_quantization(raw, cfg_file)  # a quantization not understood is refused, never read raw
    from qkinspect.loading.config import read_config

    return read_config(folder, raw)


def folder_source(folder: Path) -> tuple[TensorSource, str]:
    """The weights of a folder: safetensors (sharded or single) first, then PyTorch .bin (sharded or single)."""
    candidates = [
        ("model.safetensors.index.json", SafetensorsSource.from_index, "safetensors"),
        ("model.safetensors", lambda p: SafetensorsSource([p]), "safetensors"),
        ("pytorch_model.bin.index.json", lambda p: _torchbin().from_index(p), "bin"),
        ("pytorch_model.bin", lambda p: _torchbin()([p]), "bin"),
    ]
    for file, make, fmt in candidates:
        if (folder / file).is_file():
            return make(inside(folder, file, folder)), fmt
    raise ModelNotFoundError(
        f"{folder}: no weights (model.safetensors, model.safetensors.index.json, pytorch_model.bin or "
        f"pytorch_model.bin.index.json)"
    )


def _torchbin():
    """TorchBinSource, imported only for a .bin checkpoint."""
    from qkinspect.loading.torchbin import TorchBinSource

    return TorchBinSource


# -- the Hugging Face hub --------------------------------------------------------------------------------


def is_hub_id(spec: str) -> bool:
    """``org/name`` that is not a local path: no leading ``.``/``/``/``~``, no weight-file suffix."""
    return _HUB_ID.fullmatch(spec) is not None and not spec.lower().endswith(_WEIGHT_SUFFIXES)


def hub_cache_dir() -> Path:
    """The hub cache, read from the environment at call time: HF_HUB_CACHE, else HF_HOME/hub, else the default."""
    env = os.environ
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_snapshot(repo_id: str, revision: str | None = None) -> Path:
    """Download (or find in the cache) the config and weights of a hub model; the snapshot folder.

    Offline (HF_HUB_OFFLINE) or when the hub cannot be reached, only the local cache is used.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    cache = hub_cache_dir()
    kw = dict(repo_id=repo_id, revision=revision, cache_dir=cache, allow_patterns=HUB_PATTERNS,
              endpoint=os.environ.get("HF_ENDPOINT") or None)
    if not hub_offline():
        try:
            return checked_snapshot(cache, repo_id, Path(snapshot_download(**kw)), revision)
        except (RepositoryNotFoundError, RevisionNotFoundError, GatedRepoError) as e:
            what = "gated (accept its licence and log in)" if isinstance(e, GatedRepoError) else "not found"
            raise ModelNotFoundError(f"{repo_id}: {what} on the Hugging Face hub (revision {revision or 'main'})") \
                from None
        except Exception:
            pass  # no network, or the hub failed: fall back to the local cache below
    try:
        folder = Path(snapshot_download(**kw, local_files_only=True))
    except Exception:
        how = "offline (HF_HUB_OFFLINE)" if hub_offline() else "the hub could not be reached"
        raise ModelNotFoundError(
            f"{repo_id}: no such file or folder, and not in the Hugging Face cache at {cache} "
            f"(revision {revision or 'main'}; {how})"
        ) from None
    return checked_snapshot(cache, repo_id, folder, revision)


_COMMIT = re.compile(r"[0-9a-f]{40}")


def checked_snapshot(cache: Path, repo_id: str, folder: Path, revision: str | None = None) -> Path:
    """The snapshot folder huggingface_hub names for `repo_id`, refused unless it is the repo's
    ``snapshots/<commit>`` (a 40-hex commit hash), inside the repo's cache folder after links. huggingface_hub
    joins the text of ``refs/<revision>`` to ``snapshots/`` as it is: a refs file holding ``../../../elsewhere``
    would point the model at any folder on the machine."""
    repo = Path(cache) / f"models--{repo_id.replace('/', '--')}"
    ref = repo / "refs" / (revision or "main")
    if _COMMIT.fullmatch(folder.name) is None or os.path.normpath(folder.parent) != os.path.normpath(
            repo / "snapshots"):
        raise CheckpointError(f"{ref}: leads to {str(folder)!r}, which is not a snapshot of {repo_id} in the cache; "
                              f"refused (only the repo's own snapshots/<commit> folders are read)")
    real, root = os.path.realpath(folder), os.path.realpath(repo)
    if not real.startswith(root.rstrip(os.sep) + os.sep):
        raise CheckpointError(f"{folder}: is a link to {real}, outside the cache folder {repo}; refused")
    return folder
