"""Where a checkpoint's description enters, checked once: its JSON files, the paths it names, its counts.

A checkpoint is untrusted input. Everything it describes about itself (config.json, a shard index, GGUF metadata)
passes through here before any other code uses it, so a bad value is refused with one line naming the file and the
key instead of failing later as an internal error:

- `read_json`: a JSON object, or CheckpointError (unreadable, not JSON, nested too deeply, not an object).
- `inside`: a path the checkpoint names resolves inside the checkpoint's folder (after links), or it is refused
  before anything is opened. A Hugging Face cache snapshot's files are links to ``../../blobs/<hash>``: the repo's
  ``blobs`` folder counts as inside.
- `check_counts`: the head, layer and width counts of a config are integers from 1 to MAX_COUNT (or null where
  null means "the default"), and the query heads divide into the key/value heads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from qkinspect.errors import CheckpointError
from qkinspect.reading import MAX_JSON_BYTES, depth, os_reason, read_bytes

# Counts a config may hold (any family, any nesting level): integers >= 1. Those in NULLABLE may also be null,
# which the config classes read as "use the default" (e.g. num_key_value_heads = num_attention_heads).
COUNT_KEYS = frozenset({
    "hidden_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "head_dim",
    "n_embd", "n_head", "n_layer", "n_layers", "n_heads", "d_model", "d_kv", "num_heads", "num_layers",
    "num_kv_heads", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
    "num_decoder_layers", "attention_head_size", "embedding_size", "kv_lora_rank", "q_lora_rank",
    "qk_rope_head_dim", "v_head_dim", "multi_query_group_num", "rotary_dim",
})
NULLABLE = frozenset({"num_key_value_heads", "head_dim", "q_lora_rank", "num_kv_heads", "rotary_dim",
                      "num_decoder_layers", "attention_head_size", "embedding_size", "multi_query_group_num"})
# (query heads, key/value heads): the second must divide the first (grouped-query attention).
_GROUPS = (("num_attention_heads", "num_key_value_heads"), ("n_head", "num_kv_heads"),
           ("num_attention_heads", "num_kv_heads"), ("num_attention_heads", "multi_query_group_num"))
MAX_DEPTH = 64  # nesting a config or index may have (real ones have 3 or 4 levels)
# The largest count a description may give. Config classes build per-layer lists from the layer count (layer_types:
# 8 bytes a layer), so a count of 2**40 would exhaust memory before any tensor is looked at; real models have at most
# thousands of layers and tens of thousands of channels.
MAX_COUNT = 1 << 20


def read_text(path: Path) -> str:
    """A checkpoint file's text (a regular file of at most MAX_JSON_BYTES: a FIFO or a device is refused, never
    read), or CheckpointError saying why it cannot be read (missing, permission ...)."""
    data = read_bytes(path, limit=MAX_JSON_BYTES, error=CheckpointError)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON (not UTF-8 text at byte {e.start})") from None


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a checkpoint's file; CheckpointError when unreadable, not JSON, too deep or not an object."""
    text = read_text(path)
    try:
        data = json.loads(text)
    except RecursionError:
        raise CheckpointError(f"{path}: not valid JSON (nested too deeply)") from None
    except ValueError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: holds a JSON {_json_type(data)}, not an object")
    if depth(data, MAX_DEPTH) > MAX_DEPTH:
        raise CheckpointError(f"{path}: nested more than {MAX_DEPTH} levels deep")
    return data


def _json_type(x: Any) -> str:
    names = {list: "array", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}
    return names.get(type(x), type(x).__name__)


# -- paths -----------------------------------------------------------------------------------------------------


def allowed_roots(folder: Path) -> list[str]:
    """The real folders a checkpoint in `folder` may read from: the folder itself and, for a hub cache snapshot
    (``models--org--name/snapshots/<rev>``), the repo's ``blobs`` folder its files link to."""
    roots = [os.path.realpath(folder)]
    if folder.parent.name == "snapshots":
        blobs = folder.parent.parent / "blobs"
        if blobs.is_dir():
            roots.append(os.path.realpath(blobs))
    return roots


def inside(folder: Path, name: Any, named_by: Path, what: str = "file") -> Path:
    """``folder / name`` for a file name a checkpoint gives (an index's shard, a fixed file name), refused with
    CheckpointError unless it is a relative path that resolves, after links, inside the folder (or its hub blobs).

    Nothing is opened: only the path and its links are looked at.
    """
    if type(name) is not str or not name or "\x00" in name:
        raise CheckpointError(f"{named_by}: names {what} {name!r}, which is not a file name")
    if os.path.isabs(name):
        raise CheckpointError(f"{named_by}: names {what} {name!r}, an absolute path; refused (only files inside "
                              f"the model folder are read)")
    path = folder / name
    real = os.path.realpath(path)
    if not any(real == root or real.startswith(root.rstrip(os.sep) + os.sep) for root in allowed_roots(folder)):
        how = "a link to" if real != os.path.normpath(os.path.abspath(path)) else "the path"
        raise CheckpointError(f"{named_by}: {what} {name!r} is {how} {real}, outside the model folder {folder}; "
                              f"refused (only files inside the model folder are read)")
    return path


# -- counts ----------------------------------------------------------------------------------------------------


def check_counts(data: dict[str, Any], path: Path, where: str = "") -> None:
    """Refuse head/layer/width counts that are not positive integers, and key/value heads that do not divide the
    query heads, anywhere in a config (sub-configs included); the message names `path` and the key."""
    for key, value in data.items():
        name = f"{where}{key}"
        if isinstance(value, dict):
            check_counts(value, path, f"{name}.")
        elif key in COUNT_KEYS and not (value is None and key in NULLABLE):
            if type(value) is not int:
                raise CheckpointError(f"{path}: {name} is {value!r} ({_json_type(value)}), not a whole number")
            _in_range(value, path, name, MAX_COUNT)
    for heads, groups in _GROUPS:
        h, g = data.get(heads), data.get(groups)
        if type(h) is int and type(g) is int and h % g:
            raise CheckpointError(f"{path}: {where}{heads} ({h}) is not a multiple of {where}{groups} ({g})")


def check_names(data: dict[str, Any], path: Path) -> None:
    """Refuse an ``architectures`` that is not a list of class names (or null): the model's identity reads it."""
    archs = data.get("architectures")
    if archs is not None and (type(archs) is not list or not all(type(a) is str for a in archs)):
        shown = repr(archs) if len(repr(archs)) <= 60 else repr(archs)[:57] + "..."
        raise CheckpointError(f"{path}: architectures is {shown}, not a list of class names")


def positive_int(value: Any, path: Path, key: str, limit: int = MAX_COUNT) -> int:
    """A count from file metadata (GGUF): an integer from 1 to `limit`, else CheckpointError naming the file and
    key."""
    if isinstance(value, bool) or not isinstance(value, int):
        try:  # numpy integer scalars
            import numpy as np

            if isinstance(value, np.integer):
                value = int(value)
        except ImportError:  # pragma: no cover
            pass
    if type(value) is not int:
        raise CheckpointError(f"{path}: {key} is {value!r}, not a whole number")
    return _in_range(value, path, key, limit)


def _in_range(value: int, path: Path, key: str, limit: int) -> int:
    if value < 1:
        raise CheckpointError(f"{path}: {key} is {value}; it must be at least 1")
    if value > limit:
        raise CheckpointError(f"{path}: {key} is {value}, more than any model has (at most {limit:,})")
    return value


__all__ = ["read_json", "read_text", "inside", "allowed_roots", "check_counts", "check_names", "positive_int",
           "os_reason", "MAX_COUNT"]
