"""GGUF checkpoints (the llama.cpp format), read with the `gguf` package.

A GGUF file carries its hyper-parameters as metadata (``llama.block_count`` ...) and its tensors under llama.cpp
names (``blk.N.attn_q.weight``). This module builds the matching config (a config.json-style dict read by the light
config reader: no transformers import) and exposes the attention tensors under Hugging Face names, so the ordinary
adapter for the architecture reads them:

    blk.N.attn_q / attn_k / attn_v / attn_output   -> model.layers.N.self_attn.{q,k,v,o}_proj
    blk.N.attn_qkv                                  -> the family's fused projection (phi3, gpt2, bloom, falcon)
    blk.N.attn_norm                                 -> model.layers.N.input_layernorm (ln_1, ln_attn ...)
    blk.N.attn_q_norm / attn_k_norm                 -> model.layers.N.self_attn.{q,k}_norm
    blk.N.attn_q_a / attn_kv_a_mqa / attn_kv_b ...  -> DeepSeek's MLA projections (deepseek2); a split
    blk.N.attn_k_b + attn_v_b                       -> model.layers.N.self_attn.kv_b_proj, rebuilt

What llama.cpp's converter did to each architecture's tensors (q/k row permutation, Gemma's norm + 1, fused QKV
re-ordering) is written once per architecture in `qkinspect.loading.gguf_arch` and undone here as each tensor is
read. Only the tensors asked for are dequantised (to float32). The file is opened with `LazyArrayReader`, which
does not take the vocabulary apart (`qkinspect.loading.gguf_reader`).
"""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qkinspect.errors import CheckpointError, UnsupportedModelError, one_line
from qkinspect.loading.checked import check_counts, positive_int
from qkinspect.loading.gguf_arch import ARCHES, Layout, Meta, layer_names
from qkinspect.loading.source import TensorSource

if TYPE_CHECKING:  # torch is imported where a tensor is read, not to open the file (`qkinspect info`)
    from torch import Tensor

_GGUF_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_REQUIRED = object()  # marks a metadata key without a default


def hf_name(gguf_name: str, layout: Layout = ARCHES["llama"], names: dict[str, str] | None = None) -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight`` (for `layout`, with its `names`:
    role -> module); None for non-attention tensors."""
    names = layout.names if names is None else names
    m = _GGUF_NAME.fullmatch(gguf_name)
    if m is None or m.group(2) not in names:
        return None
    return f"{layout.prefix}.{m.group(1)}.{names[m.group(2)]}.{m.group(3)}"


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


def ungroup_qkv(w: Tensor, n_heads: int, n_kv: int) -> Tensor:
    """Invert the converter's fused-QKV re-ordering (BLOOM, Falcon): sections ``[q (H*d) | k (G*d) | v (G*d)]``
    back to Hugging Face's interleaving per KV group ``[(group, H/G + 2, d)]`` (per head for BLOOM, G = H; one
    group, i.e. sections, for Falcon-7B); `w` is a weight (rows, D) or a bias (rows,)."""
    rows, rest = w.shape[0], tuple(w.shape[1:])
    rep = n_heads // n_kv if n_kv and n_heads % n_kv == 0 else 0
    if not rep or rows % (n_heads + 2 * n_kv):
        raise CheckpointError(f"cannot undo the fused QKV order: {rows} rows for {n_heads} heads, {n_kv} KV heads")
    d = rows // (n_heads + 2 * n_kv)
    import torch

    q, k, v = w.split([n_heads * d, n_kv * d, n_kv * d])
    q = q.reshape(n_kv, rep, d, *rest)  # (H*d, ...) -> (G, rep, d, ...)
    k, v = k.reshape(n_kv, 1, d, *rest), v.reshape(n_kv, 1, d, *rest)  # (G*d, ...) -> (G, 1, d, ...)
    return torch.cat([q, k, v], dim=1).reshape(rows, *rest)  # (G, rep + 2, d, ...) -> (rows, ...)


class GGUFSource(TensorSource):
    """The attention tensors of a GGUF file under Hugging Face names, dequantised one at a time and returned as
    the Hugging Face checkpoint stores them (`layout` says what the converter changed).

    Example:
        >>> config, src = open_gguf(Path("SmolLM2-135M-Instruct.Q4_1.gguf"))  # doctest: +SKIP
        >>> src.get("model.layers.0.self_attn.k_proj.weight").shape  # doctest: +SKIP
        torch.Size([192, 576])
    """

    def __init__(self, path: Path, reader: Any, layout: Layout, config: dict[str, Any]):
        self.path = path
        self.layout = layout
        self._reader = reader
        names = layer_names(layout, config)
        self._tensors = {hf: t for t in reader.tensors if (hf := hf_name(t.name, layout, names)) is not None}
        self._role = {hf: t.name.split(".")[2] for hf, t in self._tensors.items()}
        self._tensors.update(vocab_tensors(reader.tensors, layout))  # no role: read as stored (norm + 1 undone)
        self._split = split_kv_b(reader.tensors, layout, path) if layout.mla else {}
        self._mla_widths = (int(config.get("qk_nope_head_dim", 0)), int(config.get("v_head_dim", 0)))
        H = int(config.get("num_attention_heads", config.get("n_head", 0)))
        self._heads = (H, int(config.get("num_key_value_heads", config.get("num_kv_heads", H))))

    def keys(self) -> list[str]:
        return [*self._tensors, *self._split]

    def stored_shape(self, stored_name: str) -> tuple[int, ...]:
        if stored_name in self._split:
            H, r, dn, dv = self._split_dims(stored_name)
            return (H * (dn + dv), r)
        shape = _shape(self._tensors[stored_name])
        return shape[::-1] if self._transposed(stored_name, len(shape)) else shape

    def stored_dtype(self, stored_name: str) -> str:
        return "+".join(dict.fromkeys(_dtype(t) for t in self._parts(stored_name)))

    def stored_nbytes(self, stored_name: str) -> int:
        return sum(int(t.n_bytes) for t in self._parts(stored_name))

    def _parts(self, stored_name: str) -> tuple[Any, ...]:
        """The file's tensors behind a Hugging Face name: two for a split kv_b (attn_k_b, attn_v_b), else one."""
        return self._split.get(stored_name, (self._tensors.get(stored_name),))

    def _read(self, stored_name: str) -> Tensor:
        import torch

        if stored_name in self._split:
            H, r, dn, dv = self._split_dims(stored_name)
            k_b, v_b = (self._dequantized(t) for t in self._split[stored_name])
            kv = torch.cat([k_b.reshape(H, r, dn).transpose(1, 2), v_b.reshape(H, dv, r)], dim=1)  # (H, dn+dv, r)
            return kv.reshape(H * (dn + dv), r)  # per head [k_nope (dn) | v (dv)] rows, as kv_b_proj stores them
        t = self._tensors[stored_name]
        try:
            return self._as_hf(stored_name, self._dequantized(t))
        except CheckpointError as e:  # the converter's layout cannot be undone: said with the file and tensor
            if str(e).startswith(str(self.path)):
                raise
            raise CheckpointError(f"{self.path}: tensor {t.name!r} {_ne(t)}: {e}") from None

    def _dequantized(self, t: Any) -> Tensor:
        import numpy as np
        import torch
        from gguf.quants import dequantize

        try:
            data = dequantize(t.data, t.tensor_type)
            w = torch.from_numpy(np.array(data, dtype=np.float32))  # a copy: never a view of the file mapping
            return w.reshape(_shape(t))
        except Exception as e:
            raise CheckpointError(f"{self.path}: cannot read tensor {t.name!r} ({one_line(e)})") from None

    def _split_dims(self, stored_name: str) -> tuple[int, int, int, int]:
        """(H, r, dn, dv) of a split kv_b: attn_k_b is (H, r, dn) in numpy order (each head's k_nope block
        transposed), attn_v_b (H, dv, r); anything else is refused."""
        k_b, v_b = self._split[stored_name]
        ks, vs = _shape(k_b, 3), _shape(v_b, 3)
        H, (dn, dv) = self._heads[0], self._mla_widths
        if (len(ks), len(vs)) != (3, 3) or ks[0] != H or vs[0] != H or ks[2] != dn or vs[1] != dv or ks[1] != vs[2]:
            raise CheckpointError(f"{self.path}: {k_b.name!r} {_ne(k_b)} and {v_b.name!r} {_ne(v_b)} "
                                  f"are not llama.cpp's split kv_b ([{dn}, r, {H}] and [r, {dv}, {H}])")
        return H, ks[1], dn, dv

    def _as_hf(self, stored_name: str, w: Tensor) -> Tensor:
        """Undo what llama.cpp's converter did to this tensor (see qkinspect.loading.gguf_arch)."""
        role, (H, G), lay = self._role.get(stored_name), self._heads, self.layout
        if lay.permuted_qk and role in ("attn_q", "attn_k"):
            w = unpermute_rows(w, H if role == "attn_q" else G)  # K is permuted with the KV-head count
        if lay.norm_plus_one and stored_name.endswith("norm.weight"):
            w = w - 1.0  # written as gamma + 1
        if lay.qkv == "grouped" and role == "attn_qkv":
            w = ungroup_qkv(w, H, G)
        if self._transposed(stored_name, w.dim()):
            w = w.T.contiguous()  # GPT-2's Conv1D stores (in, out)
        return w

    def _transposed(self, stored_name: str, ndim: int) -> bool:
        return self.layout.qkv == "transposed" and ndim == 2 and self._role.get(stored_name) in ("attn_qkv",
                                                                                                 "attn_output")

    def metadata(self, key: str) -> str | None:
        """A string metadata field (e.g. ``general.name``), or None when absent or not text."""
        try:
            value = gguf_field(self._reader, key, self.path, None) if self._reader is not None else None
        except CheckpointError:  # an unreadable name is no reason to refuse the weights
            return None
        return " ".join(value.split()) or None if isinstance(value, str) else None

    def vocabulary(self, limit: int) -> tuple[list[str], str | None] | None:
        """The tokens of ``tokenizer.ggml.tokens`` (at most `limit`) and ``tokenizer.ggml.model`` ("gpt2": byte-level
        BPE, "llama": SentencePiece ...); None when the file has no token list."""
        from qkinspect.loading.gguf_reader import string_array

        field = None if self._reader is None else self._reader.fields.get("tokenizer.ggml.tokens")
        if field is None:
            return None
        try:
            tokens = string_array(self._reader, field, limit)
        except (ValueError, IndexError, struct.error) as e:
            raise CheckpointError(f"{self.path}: GGUF metadata 'tokenizer.ggml.tokens' is unreadable "
                                  f"({one_line(e)})") from None
        model = gguf_field(self._reader, "tokenizer.ggml.model", self.path, None)
        return tokens, model if isinstance(model, str) else None

    def close(self) -> None:
        self._tensors, self._split = {}, {}
        self._reader = None


def vocab_tensors(tensors: Any, layout: Layout) -> dict[str, Any]:
    """The token embedding, the output (unembedding) and the final norm under the Hugging Face names of
    `qkinspect.loading.vocab_names` (with the base-model prefix the layout's layer names carry); {} for a family
    whose names are not mapped."""
    from qkinspect.loading.vocab_names import GGUF_ROLES, VOCAB

    names = VOCAB.get(layout.model_type)
    if names is None:
        return {}
    base = layout.prefix.rsplit(".", 1)[0] + "." if "." in layout.prefix else ""
    out = {}
    for t in tensors:
        field_name = GGUF_ROLES.get(t.name)
        hf = None if field_name is None else getattr(names, field_name)
        if hf is not None:
            out[hf if field_name == "unembed" else base + hf] = t
    return out


def split_kv_b(tensors: Any, layout: Layout, path: Path) -> dict[str, tuple[Any, Any]]:
    """``model.layers.N.self_attn.kv_b_proj.weight`` -> (attn_k_b, attn_v_b) of layer N, for files written since
    llama.cpp's MLA change (one without the other is refused)."""
    found: dict[int, dict[str, Any]] = {}
    for t in tensors:
        m = _GGUF_NAME.fullmatch(t.name)
        if m is not None and m.group(2) in ("attn_k_b", "attn_v_b"):
            if m.group(3) != "weight":
                raise UnsupportedModelError(f"{path}: {t.name!r}: llama.cpp's split kv_b has no bias")
            found.setdefault(int(m.group(1)), {})[m.group(2)] = t
    out = {}
    for i, pair in sorted(found.items()):
        if len(pair) != 2:
            (role,) = pair
            other = "attn_v_b" if role == "attn_k_b" else "attn_k_b"
            raise CheckpointError(f"{path}: blk.{i}.{role}.weight is there but blk.{i}.{other}.weight is missing")
        out[f"{layout.prefix}.{i}.self_attn.kv_b_proj.weight"] = (pair["attn_k_b"], pair["attn_v_b"])
    return out


def _shape(t: Any, ndim: int = 0) -> tuple[int, ...]:
    """A GGUF tensor's shape in numpy/torch order (GGUF lists dimensions fastest-varying first: ne0 = columns), with
    leading 1s up to `ndim` dimensions."""
    shape = tuple(int(n) for n in reversed(t.shape.tolist()))
    return (1,) * (ndim - len(shape)) + shape


def _ne(t: Any) -> list[int]:
    """A GGUF tensor's shape as GGUF lists it (ne0 first)."""
    return [int(n) for n in t.shape.tolist()]


def _dtype(t: Any) -> str:
    name = t.tensor_type.name
    return {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}.get(name, name.lower())


def open_gguf(path: Path) -> tuple[Any, GGUFSource]:
    """Read a GGUF file's metadata: (config, tensor source). No tensor data is read, transformers is not imported
    unless the light config reader needs it.

    Raises:
        CheckpointError: the file is corrupt or truncated, or its metadata lacks a required key.
        UnsupportedModelError: its ``general.architecture`` has no mapping here.
    """
    reader = gguf_file_reader(path)
    arch = str(gguf_field(reader, "general.architecture", path))
    if arch not in ARCHES:
        raise UnsupportedModelError(
            f"{path}: GGUF architecture {arch!r} is not supported; supported: {', '.join(sorted(ARCHES))}"
        )
    data = gguf_config_dict(reader, arch, path)
    return light_config(data, path), GGUFSource(path, reader, ARCHES[arch], data)


# Metadata counts checked as they are read: a block count of 2**30 would otherwise build per-layer lists of gigabytes.
_COUNTS = (".block_count", ".embedding_length", ".attention.head_count", ".attention.head_count_kv",
           ".attention.key_length", ".attention.value_length", ".rope.dimension_count", ".attention.key_length_mla",
           ".attention.value_length_mla", ".attention.q_lora_rank", ".attention.kv_lora_rank")


def gguf_config_dict(reader: Any, arch: str, path: Path) -> dict[str, Any]:
    """The config.json-style dict that GGUF metadata describes (`arch` is ``general.architecture``)."""
    layout = ARCHES[arch]

    def read(key: str, default: Any, per_layer: bool) -> Any:
        value = gguf_field(reader, key, path, _REQUIRED if default is ... else default)
        if key.endswith(_COUNTS) and value is not default:  # metadata enters here: whole numbers, 1 to MAX_COUNT
            for v in value if isinstance(value, list) else [value]:
                positive_int(v, path, key)
        return _uniform(value, key, path) if isinstance(value, list) and not per_layer else value

    meta = Meta(arch, read, lambda suffix: _has_tensor(reader, suffix), _vocab_size(reader))
    try:
        data = layout.config(meta)
    except (TypeError, ValueError, ZeroDivisionError) as e:
        raise CheckpointError(f"{path}: GGUF metadata for {arch!r} is invalid ({one_line(e)})") from None
    except UnsupportedModelError as e:  # a form qkinspect does not read (said without the path)
        raise UnsupportedModelError(f"{path}: GGUF {arch!r}: {one_line(e)}") from None
    data = {"model_type": layout.model_type, "architectures": [layout.architecture], **data}
    check_counts(data, path)  # what the counts imply together (key/value heads dividing the query heads)
    return data


def gguf_config(reader: Any, arch: str, path: Path) -> Any:
    """The config (a LightConfig, or transformers' where the light rules defer) that GGUF metadata describes."""
    return light_config(gguf_config_dict(reader, arch, path), path)


def light_config(data: dict[str, Any], path: Path) -> Any:
    """`data` read by the light config reader; transformers' config class only where its rules defer."""
    from qkinspect.loading.config import LightConfig

    def real() -> Any:
        from transformers import AutoConfig

        from qkinspect.loading.config import quiet_transformers

        try:
            with quiet_transformers():
                return AutoConfig.for_model(data["model_type"], **{k: v for k, v in data.items() if k != "model_type"})
        except Exception as e:
            raise CheckpointError(f"{path}: transformers cannot build a config from this GGUF metadata "
                                  f"({one_line(e)})") from None

    return LightConfig(data, data["model_type"], real)


def gguf_file_reader(path: Path) -> Any:
    """The file's GGUF reader (metadata and tensor index, arrays read lazily)."""
    from qkinspect.loading.gguf_reader import LazyArrayReader

    try:
        reader = LazyArrayReader(path, "r")
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file is missing") from None
    except Exception as e:  # the reader raises ValueError, struct/numpy errors ... on corrupt input
        raise CheckpointError(f"{path}: not a readable GGUF file, corrupt or truncated ({one_line(e)})") from None
    size = path.stat().st_size
    for t in reader.tensors:
        if int(t.data_offset) + int(t.n_bytes) > size:
            raise CheckpointError(f"{path}: truncated: tensor {t.name!r} ends past the end of the file")
    return reader


def gguf_field(reader: Any, key: str, path: Path, default: Any = _REQUIRED) -> Any:
    f = reader.fields.get(key)
    if f is None:
        if default is _REQUIRED:
            raise CheckpointError(f"{path}: GGUF metadata has no {key!r}")
        return default
    try:
        return f.contents()
    except Exception as e:
        raise CheckpointError(f"{path}: GGUF metadata {key!r} is unreadable ({one_line(e)})") from None


def _uniform(value: Any, key: str, path: Path) -> int:
    """A per-model count; some files store one per layer, which must then agree."""
    if isinstance(value, list):
        if not value or len(set(value)) != 1:
            raise UnsupportedModelError(f"{path}: {key} varies across layers ({sorted(set(value))})")
        value = value[0]
    return int(value)


def _vocab_size(reader: Any) -> int | None:
    from qkinspect.loading.gguf_reader import array_length

    tokens = reader.fields.get("tokenizer.ggml.tokens")
    return array_length(tokens) if tokens is not None else None


def _has_tensor(reader: Any, suffix: str) -> bool:
    return any(t.name.endswith(suffix) for t in reader.tensors)




__all__ = ["open_gguf", "GGUFSource", "gguf_config", "gguf_config_dict", "hf_name", "unpermute_rows",
           "ungroup_qkv", "ARCHES"]
