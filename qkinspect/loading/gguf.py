"""GGUF checkpoints (the llama.cpp format), read with the `gguf` package.

A GGUF file carries its hyper-parameters as metadata (``llama.block_count`` ...) and its tensors under llama.cpp
names (``blk.N.attn_q.weight``). This module synthesises the matching transformers config and exposes the attention
tensors under Hugging Face names, so the ordinary adapter for the architecture reads them:

    blk.N.attn_q / attn_k / attn_v / attn_output   -> model.layers.N.self_attn.{q,k,v,o}_proj
    blk.N.attn_norm                                 -> model.layers.N.input_layernorm
    blk.N.attn_q_norm / attn_k_norm                 -> model.layers.N.self_attn.{q,k}_norm

Only the tensors asked for are dequantised (to float32). llama.cpp's converter permutes the rows of Q and K for
the ``llama`` architecture (its rotary kernel pairs adjacent dimensions, Hugging Face's pairs the two halves):
`unpermute_rows` undoes that, so the matrices equal the Hugging Face ones.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from qkinspect.errors import CheckpointError, UnsupportedModelError
from qkinspect.loading.checked import MAX_COUNT, positive_int
from qkinspect.loading.source import TensorSource

_ROLE = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_norm": "input_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
_GGUF_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_REQUIRED = object()  # marks a metadata key without a default


@dataclass(frozen=True)
class Arch:
    """How one GGUF architecture maps to transformers."""

    config_class: str
    architecture: str
    permuted_qk: bool  # convert_hf_to_gguf.py permutes q/k rows (LlamaModel.permute)


ARCHES = {
    "llama": Arch("LlamaConfig", "LlamaForCausalLM", permuted_qk=True),  # Llama, Mistral, SmolLM ...
    "qwen2": Arch("Qwen2Config", "Qwen2ForCausalLM", permuted_qk=False),  # NeoX-style rope: rows kept as in HF
    "qwen3": Arch("Qwen3Config", "Qwen3ForCausalLM", permuted_qk=False),
}


def hf_name(gguf_name: str) -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``; None for non-attention tensors."""
    m = _GGUF_NAME.fullmatch(gguf_name)
    if m is None or m.group(2) not in _ROLE:
        return None
    return f"model.layers.{m.group(1)}.{_ROLE[m.group(2)]}.{m.group(3)}"


def unpermute_rows(w: Tensor, n_heads: int) -> Tensor:
    """Invert llama.cpp's q/k row permutation for `n_heads` heads; `w` is a weight (n*d, D) or a bias (n*d,).

    llama.cpp stores row ``h*d + 2*i + j`` what Hugging Face stores at row ``h*d + j*d/2 + i`` (j in {0, 1}).
    """
    rows, rest = w.shape[0], tuple(w.shape[1:])
    if rows % n_heads or (rows // n_heads) % 2:
        raise CheckpointError(f"cannot undo the q/k row permutation: {rows} rows for {n_heads} heads")
    d = rows // n_heads
    w = w.reshape(n_heads, d // 2, 2, *rest)  # (n*d, ...) -> (n, d/2, 2, ...): llama.cpp's adjacent pairs
    return w.transpose(1, 2).reshape(rows, *rest)  # (n, 2, d/2, ...) -> (n*d, ...): HF's halves


class GGUFSource(TensorSource):
    """The attention tensors of a GGUF file under Hugging Face names, dequantised one at a time.

    Example:
        >>> config, src = open_gguf(Path("SmolLM2-135M-Instruct.Q4_1.gguf"))  # doctest: +SKIP
        >>> src.get("model.layers.0.self_attn.k_proj.weight").shape  # doctest: +SKIP
        torch.Size([192, 576])
    """

    def __init__(self, path: Path, reader: Any, n_heads: int, n_kv_heads: int, permuted_qk: bool):
        self.path = path
        self._reader = reader
        self._tensors = {hf: t for t in reader.tensors if (hf := hf_name(t.name)) is not None}
        # Heads per permuted projection: K is permuted with the KV-head count (grouped-query attention).
        self._permuted = {"q_proj": n_heads, "k_proj": n_kv_heads} if permuted_qk else {}

    def keys(self) -> list[str]:
        return list(self._tensors)

    def stored_shape(self, stored_name: str) -> tuple[int, ...]:
        # GGUF lists dimensions fastest-varying first (ne0 = columns): numpy/torch order is the reverse.
        return tuple(int(n) for n in reversed(self._tensors[stored_name].shape.tolist()))

    def stored_dtype(self, stored_name: str) -> str:
        name = self._tensors[stored_name].tensor_type.name
        return {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}.get(name, name.lower())

    def stored_nbytes(self, stored_name: str) -> int:
        return int(self._tensors[stored_name].n_bytes)

    def _read(self, stored_name: str) -> Tensor:
        from gguf.quants import dequantize

        t = self._tensors[stored_name]
        try:
            data = dequantize(t.data, t.tensor_type)
            w = torch.from_numpy(np.array(data, dtype=np.float32))  # a copy: never a view of the file mapping
            w = w.reshape(self.stored_shape(stored_name))
        except Exception as e:
            raise CheckpointError(f"{self.path}: cannot read tensor {t.name!r} ({_one_line(e)})") from None
        proj = stored_name.split(".")[-2]
        if proj in self._permuted:
            w = unpermute_rows(w, self._permuted[proj])
        return w

    def close(self) -> None:
        self._tensors = {}
        self._reader = None


def open_gguf(path: Path) -> tuple[Any, GGUFSource]:
    """Read a GGUF file's metadata: (transformers config, tensor source). No tensor data is read.

    Raises:
        CheckpointError: the file is corrupt or truncated, or its metadata lacks a required key.
        UnsupportedModelError: its ``general.architecture`` has no mapping here.
    """
    reader = _reader(path)
    arch = _field(reader, "general.architecture", path)
    if type(arch) is not str:
        raise CheckpointError(f"{path}: general.architecture is {arch!r}, not a string")
    if arch not in ARCHES:
        raise UnsupportedModelError(
            f"{path}: GGUF architecture {arch!r} is not supported; supported: {', '.join(sorted(ARCHES))}"
        )
    config = gguf_config(reader, arch, path)
    return config, GGUFSource(path, reader, config.num_attention_heads, config.num_key_value_heads,
                              ARCHES[arch].permuted_qk)


def gguf_config(reader: Any, arch: str, path: Path) -> Any:
    """The transformers config that GGUF metadata describes (`arch` is ``general.architecture``)."""
    import transformers

    def meta(key: str, default: Any = _REQUIRED) -> Any:
        return _field(reader, f"{arch}.{key}", path, default)

    def count(key: str, default: Any = _REQUIRED, limit: int = MAX_COUNT) -> int:  # metadata enters here
        return positive_int(meta(key, default), path, f"{arch}.{key}", limit)

    def number(key: str, default: float) -> float:
        value = meta(key, default)
        if isinstance(value, (bool, str, list)) or not math.isfinite(value) or value <= 0:
            raise CheckpointError(f"{path}: {arch}.{key} is {value!r}, not a positive number")
        return float(value)

    D = count("embedding_length")
    H = _uniform(meta("attention.head_count"), f"{arch}.attention.head_count", path)
    G = _uniform(meta("attention.head_count_kv", H), f"{arch}.attention.head_count_kv", path)
    if H % G:
        raise CheckpointError(f"{path}: {arch}.attention.head_count ({H}) is not a multiple of "
                              f"{arch}.attention.head_count_kv ({G})")
    if meta("attention.key_length", None) is None and D % H:
        raise CheckpointError(f"{path}: {arch}.embedding_length ({D}) is not a multiple of "
                              f"{arch}.attention.head_count ({H}) and no attention.key_length is given")
    d = count("attention.key_length", D // H)
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": number("rope.freq_base", 10000.0)}
    rotary = count("rope.dimension_count", d)
    if rotary > d or rotary % 2:
        raise CheckpointError(f"{path}: {arch}.rope.dimension_count ({rotary}) must be even and at most the head "
                              f"dimension ({d})")
    if rotary != d:
        rope["partial_rotary_factor"] = rotary / d
    cls = getattr(transformers, ARCHES[arch].config_class)
    kwargs = dict(
        vocab_size=count("vocab_size", _vocab_size(reader), limit=1 << 40),
        hidden_size=D,
        intermediate_size=_uniform(meta("feed_forward_length", 4 * D), f"{arch}.feed_forward_length", path),
        num_hidden_layers=count("block_count"),
        num_attention_heads=H,
        num_key_value_heads=G,
        head_dim=d,
        rms_norm_eps=number("attention.layer_norm_rms_epsilon", 1e-6),
        max_position_embeddings=count("context_length", 2048, limit=1 << 40),
        rope_parameters=rope,
        architectures=[ARCHES[arch].architecture],
        **({"attention_bias": _has_tensor(reader, "attn_q.bias")} if arch == "llama" else {}),
    )
    try:
        return cls(**kwargs)
    except Exception as e:  # the config class checks more (e.g. the width divides into the heads)
        raise CheckpointError(f"{path}: GGUF metadata describes a model transformers refuses "
                              f"({_one_line(e)})") from None



MAX_ARRAY = 1 << 21  # elements in one metadata array (the largest real ones, token lists, hold a few hundred thousand)


def _reader(path: Path) -> Any:
    from gguf import GGUFReader, GGUFValueType

    class CheckedReader(GGUFReader):
        """gguf's reader, refusing reads past the end of the file and huge arrays. Unchecked, a read past the end
        returns nothing and costs nothing, so an array length of 2**40 in a mutated header looped for ever,
        growing a list of empty parts by gigabytes."""

        def _get(self, offset, dtype, count=1, override_order=None):
            end = int(offset) + int(np.dtype(dtype).itemsize) * int(count)
            if offset < 0 or end > len(self.data):
                raise ValueError(f"a header field at byte {offset} reads past the end of the file")
            return super()._get(offset, dtype, count, override_order)

        def _get_field_parts(self, orig_offs, raw_type):
            if int(raw_type) == GGUFValueType.ARRAY:  # item type (uint32), length (uint64), items
                length = int(self._get(orig_offs + 4, np.uint64)[0])
                if length > MAX_ARRAY:
                    raise ValueError(f"a metadata array at byte {orig_offs} claims {length} elements")
            return super()._get_field_parts(orig_offs, raw_type)

    try:
        reader = CheckedReader(path, "r")
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file is missing") from None
    except Exception as e:  # the reader raises ValueError, struct/numpy errors ... on corrupt input
        raise CheckpointError(f"{path}: not a readable GGUF file, corrupt or truncated ({_one_line(e)})") from None
    size = path.stat().st_size
    for t in reader.tensors:
        if int(t.data_offset) + int(t.n_bytes) > size:
            raise CheckpointError(f"{path}: truncated: tensor {t.name!r} ends past the end of the file")
    return reader


def _field(reader: Any, key: str, path: Path, default: Any = _REQUIRED) -> Any:
    f = reader.fields.get(key)
    if f is None:
        if default is _REQUIRED:
            raise CheckpointError(f"{path}: GGUF metadata has no {key!r}")
        return default
    try:
        return f.contents()
    except Exception as e:
        raise CheckpointError(f"{path}: GGUF metadata {key!r} is unreadable ({_one_line(e)})") from None


def _uniform(value: Any, key: str, path: Path) -> int:
    """A per-model count; some files store one per layer, which must then agree."""
    if isinstance(value, list):
        values = [positive_int(v, path, key) for v in value]
        if not values or len(set(values)) != 1:
            raise UnsupportedModelError(f"{path}: {key} varies across layers ({sorted(set(values))})")
        value = values[0]
    return positive_int(value, path, key)


def _vocab_size(reader: Any) -> int:
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    return len(tokens.data) if tokens is not None else 32000


def _has_tensor(reader: Any, suffix: str) -> bool:
    return any(t.name.endswith(suffix) for t in reader.tensors)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


__all__ = ["open_gguf", "GGUFSource", "gguf_config", "hf_name", "unpermute_rows", "ARCHES"]
