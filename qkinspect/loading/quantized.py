"""Quantized safetensors checkpoints: which ``quantization_config`` qkinspect understands, dequantizing those on
read, and refusing the rest.

A quantized checkpoint stores integers or FP8 values plus scales; its raw values are not the model's weights (an FP8
block-quantized W_Q read without its ``weight_scale_inv`` is off by a factor of hundreds). So a config that declares
a quantization this module does not understand is refused where it enters, never read raw; one it understands is
read through `DequantizingSource`, which gives each quantized weight back in float32 as it is read.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qkinspect.errors import CheckpointError, UnsupportedModelError, one_line
from qkinspect.loading.source import TensorSource, storage_dtype

if TYPE_CHECKING:  # torch is imported where weights are dequantized, not where a config is checked
    from torch import Tensor

# Keys under which a config.json declares its quantization (compressed-tensors wrote ``compression_config`` before
# transformers adopted ``quantization_config``).
QUANT_KEYS = ("quantization_config", "compression_config")
UNDERSTOOD: dict[str, str] = {  # quant_method -> what it is
    "fp8": "FP8 weights with weight_scale_inv per block, per output row or per tensor",
    "compressed-tensors": "llm-compressor's formats: " + ", ".join(("pack-quantized", "naive-quantized",
                                                                    "int-quantized", "float-quantized")),
}


def declared_quantization(raw: dict) -> tuple[str, Any] | None:
    """(key path, value) of the first quantization declaration in a config.json (top level or a sub-config such as
    ``text_config``), or None."""
    for key in QUANT_KEYS:
        if raw.get(key) is not None:
            return key, raw[key]
    for name, sub in raw.items():
        if isinstance(sub, dict):
            found = declared_quantization(sub)
            if found is not None:
                return f"{name}.{found[0]}", found[1]
    return None


def check_quantization(raw: dict, cfg_file: Path) -> dict | None:
    """The config's quantization_config when qkinspect can dequantize it, None when there is none.

    Raises:
        UnsupportedModelError: the config declares a quantization that is not understood (it is never read raw).
    """
    found = declared_quantization(raw)
    if found is None:
        return None
    key, qc = found
    method = qc.get("quant_method") if isinstance(qc, dict) else None
    if key == "quantization_config" and type(method) is str and method in UNDERSTOOD:
        check_understood(qc, cfg_file)
        return qc
    what = f"quant_method {method!r}" if type(method) is str else "a quantization without a quant_method"
    supported = ", ".join(sorted(UNDERSTOOD)) or "none"
    raise UnsupportedModelError(
        f"{cfg_file}: {key} declares {what}, which qkinspect cannot dequantize (supported: {supported}); "
        f"its raw values are not the model's weights, so it is refused"
    )


def check_understood(qc: dict, cfg_file: Path) -> None:
    """The fields of an understood quantization_config that qkinspect reads, checked where they enter: the FP8 block
    size two whole numbers from 1; compressed-tensors' config_groups an object of objects, its ignore list and
    every group's targets strings, their ``re:`` patterns valid regular expressions. CheckpointError naming the file
    and the key otherwise."""
    from qkinspect.loading.checked import MAX_COUNT

    def bad(key: str, value: Any, want: str) -> CheckpointError:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        return CheckpointError(f"{cfg_file}: quantization_config.{key} is {shown}; {want}")

    if qc["quant_method"] == "fp8":
        block = qc.get("weight_block_size")
        if block is not None and not (type(block) is list and len(block) == 2
                                      and all(type(n) is int and 1 <= n <= MAX_COUNT for n in block)):
            raise bad("weight_block_size", block, f"expected two whole numbers from 1 to {MAX_COUNT:,} "
                                                  "(rows, columns) or null")
        return
    fmt = qc.get("format")
    if fmt is not None and type(fmt) is not str:
        raise bad("format", fmt, "expected a format name")
    _check_targets(qc.get("ignore"), "ignore", bad)
    groups = qc.get("config_groups")
    if groups is None:
        return
    if type(groups) is not dict:
        raise bad("config_groups", groups, "expected an object of named groups")
    for name, group in groups.items():
        key = f"config_groups.{name}"
        if type(group) is not dict:
            raise bad(key, group, "expected an object (targets, weights ...)")
        for field in ("weights", "input_activations", "output_activations"):
            if group.get(field) is not None and type(group[field]) is not dict:
                raise bad(f"{key}.{field}", group[field], "expected an object or null")
        if group.get("format") is not None and type(group["format"]) is not str:
            raise bad(f"{key}.format", group["format"], "expected a format name")
        _check_targets(group.get("targets"), f"{key}.targets", bad)


def _check_targets(targets: Any, key: str, bad: Any) -> None:
    """A list of target strings (class names, module names, or ``re:`` and a regular expression), or null."""
    if targets is None:
        return
    if type(targets) is not list or not all(type(t) is str for t in targets):
        raise bad(key, targets, "expected a list of names")
    for t in targets:
        if t.startswith("re:"):
            try:
                re.compile(t[3:])
            except (re.error, RecursionError, OverflowError) as e:
                raise bad(key, t, f"not a regular expression ({e})") from None


# -- dequantizing on read -----------------------------------------------------------------------------------------

FP8 = ("float8_e4m3fn", "float8_e5m2")  # storage dtypes, by name
CT_FORMATS = ("pack-quantized", "naive-quantized", "int-quantized", "float-quantized")  # compressed-tensors


def describe(qc: dict) -> str:
    """One line for `info` and the output's processing: the method, format and weights' bits and grouping."""
    if qc["quant_method"] == "fp8":
        block = qc.get("weight_block_size")
        return f"fp8 ({'x'.join(map(str, block)) + ' blocks' if block else 'per-tensor/per-channel scales'})"
    groups = [g.get("weights") or {} for g in (qc.get("config_groups") or {}).values()]
    parts = sorted({f"{w.get('type', 'int')}{w.get('num_bits', '?')} {w.get('strategy', '?')}"
                    + (f" {w['group_size']}" if w.get("group_size") else "") for w in groups})
    return f"compressed-tensors {qc.get('format', '?')} ({', '.join(parts)})"


class DequantizingSource(TensorSource):
    """A quantized checkpoint's tensors with each quantized ``X.weight`` dequantized to float32 as it is read, one
    tensor (so one layer) at a time; the scales and packing tensors themselves are hidden.

    ``fp8``: ``X.weight`` in float8 with ``X.weight_scale_inv`` beside it: one scale per block of
    ``weight_block_size`` (DeepSeek-V3, Qwen3-FP8), per output row, or per tensor; W = w * scale_inv.
    ``compressed-tensors``: the module's tensors (``weight_packed``, ``weight_scale``, ``weight_zero_point``,
    ``weight_shape`` ...) handed to the `compressed-tensors` package's own compressor for the format.
    """

    def __init__(self, inner: TensorSource, qc: dict, path: Path):
        self.inner, self.qc, self.path = inner, qc, path
        self.method = qc["quant_method"]
        self.quantization = describe(qc)
        hidden = _HIDDEN[self.method]
        inner_keys = inner.keys()
        self._virtual = {k.removesuffix("_packed") for k in inner_keys if k.endswith(".weight_packed")}
        self._keys = [k for k in inner_keys if not k.endswith(hidden)] + sorted(self._virtual)
        self._inner_keys = set(inner_keys)
        if self.method == "compressed-tensors":
            self._schemes = ct_schemes(qc, path)

    def keys(self) -> list[str]:
        return self._keys

    def stored_shape(self, stored_name: str) -> tuple[int, ...]:
        if stored_name in self._virtual:
            return tuple(int(n) for n in self.inner._read(stored_name + "_shape").tolist())
        return self.inner.stored_shape(stored_name)

    def stored_dtype(self, stored_name: str) -> str:
        if stored_name in self._virtual:
            return "packed int32"
        return self.inner.stored_dtype(stored_name)

    def stored_nbytes(self, stored_name: str) -> int:
        own = [n for n in self._module_tensors(stored_name) if n in self._inner_keys]
        return sum(self.inner.stored_nbytes(n) for n in own) or self.inner.stored_nbytes(stored_name)

    def shard_of(self, stored_name: str) -> Any:
        return self.inner.shard_of(stored_name + "_packed" if stored_name in self._virtual else stored_name)

    def release(self, shard: Any) -> None:
        self.inner.release(shard)

    def close(self) -> None:
        self.inner.close()

    def _module_tensors(self, stored_name: str) -> list[str]:
        """The stored tensors that make up `stored_name` (a weight and its scales ...)."""
        module = stored_name.removesuffix(".weight")
        if not stored_name.endswith(".weight"):
            return [stored_name]
        return [f"{module}.{p}" for p in ("weight", "weight_scale_inv", "weight_packed", "weight_scale",
                                         "weight_zero_point", "weight_shape", "weight_g_idx")]

    def _read(self, stored_name: str) -> Tensor:
        if self.method == "fp8":
            return self._read_fp8(stored_name)
        return self._read_ct(stored_name)

    def _read_fp8(self, stored_name: str) -> Tensor:
        w = self.inner._read(stored_name)
        if storage_dtype(w) not in FP8:
            return w
        scale_name = stored_name + "_scale_inv"
        if scale_name not in self._inner_keys:
            raise CheckpointError(f"{self.path}: FP8 tensor {stored_name!r} has no {scale_name!r} beside it")
        return fp8_dequantize(w, self.inner._read(scale_name), self.qc.get("weight_block_size"),
                              f"{self.path}: {stored_name}")

    def _read_ct(self, stored_name: str) -> Tensor:
        module = stored_name.removesuffix(".weight")
        scheme = ct_scheme_for(self._schemes, module) if stored_name.endswith(".weight") else None
        quantized = any(f"{module}.{p}" in self._inner_keys for p in ("weight_packed", "weight_scale"))
        if scheme is None or not quantized:  # "Linear" targets name a class: a norm's weight is not quantized
            w = self.inner._read(stored_name)
            if not w.is_floating_point() or storage_dtype(w) in FP8:
                raise CheckpointError(f"{self.path}: {stored_name!r} is stored as {w.dtype} without the scales "
                                      f"of its quantization")
            return w
        fmt, scheme = scheme
        import torch
        from compressed_tensors.compressors import BaseCompressor

        compressor = BaseCompressor.get_value_from_registry(fmt)
        names = [n for n in compressor.compression_param_names(scheme) if f"{module}.{n}" in self._inner_keys]
        if "weight" not in names and f"{module}.weight" in self._inner_keys:
            names.append("weight")
        local = {n: self.inner._read(f"{module}.{n}") for n in names}
        try:
            out = compressor.decompress(local, scheme)["weight"]
        except Exception as e:
            raise CheckpointError(f"{self.path}: cannot dequantize {stored_name!r} ({fmt}: {one_line(e)})") from None
        return out.to(torch.float32)


_HIDDEN = {"fp8": ("_scale_inv",),
           "compressed-tensors": (".weight_packed", ".weight_scale", ".weight_zero_point", ".weight_shape",
                                  ".weight_g_idx", ".input_scale", ".output_scale", ".input_global_scale",
                                  ".weight_global_scale")}


def fp8_dequantize(w: Tensor, scale_inv: Tensor, block: list[int] | None, where: str) -> Tensor:
    """float32 W = w * scale_inv, the scale taken per block of `block` = [rows, cols] (the last blocks may be
    partial), per output row, or per tensor, as the scale's shape says."""
    import torch

    s = scale_inv.to(torch.float32)
    if w.dim() not in (1, 2):
        raise CheckpointError(f"{where}: an FP8 tensor of shape {tuple(w.shape)}; expected a weight or a bias")
    if s.numel() == 1:
        return w.to(torch.float32) * s.reshape(())
    if w.dim() == 1:  # a bias: one scale per element, or one for the tensor
        if s.shape not in (w.shape, (w.shape[0], 1)):
            raise CheckpointError(f"{where}: scale of shape {tuple(s.shape)} for a bias of shape {tuple(w.shape)}")
        return w.to(torch.float32) * s.reshape(w.shape)
    O, I = w.shape  # noqa: E741
    if s.shape in ((O,), (O, 1)):
        return w.to(torch.float32) * s.reshape(O, 1)
    if s.dim() != 2:
        raise CheckpointError(f"{where}: scale of shape {tuple(s.shape)} for a weight of shape {(O, I)}")
    bo, bi = block if block else (-(-O // s.shape[0]), -(-I // s.shape[1]))
    if s.shape != (-(-O // bo), -(-I // bi)):
        raise CheckpointError(f"{where}: scale grid {tuple(s.shape)} does not fit {(O, I)} in {bo}x{bi} blocks")
    full = s.repeat_interleave(bo, dim=0)[:O].repeat_interleave(bi, dim=1)[:, :I]  # (O/bo, I/bi) -> (O, I)
    return w.to(torch.float32) * full


def ct_schemes(qc: dict, path: Path) -> list[tuple[list[str], str, Any]]:
    """compressed-tensors config groups as (targets, format, QuantizationScheme), with the ignore list first
    (targets, None, None); only weight formats this module dequantizes are accepted."""
    try:
        from compressed_tensors.quantization import QuantizationScheme
    except ImportError:
        raise UnsupportedModelError(f"{path}: a compressed-tensors checkpoint needs the compressed-tensors package "
                                    f"(pip install 'qkinspect[quantized]')") from None
    out: list[tuple[list[str], str | None, Any]] = [(list(qc.get("ignore") or []), None, None)]
    for name, group in (qc.get("config_groups") or {}).items():
        fmt = (group.get("format") if isinstance(group, dict) else None) or qc.get("format")
        if fmt not in CT_FORMATS:
            raise UnsupportedModelError(f"{path}: compressed-tensors format {fmt!r} (group {name!r}) is not "
                                        f"supported; supported: {', '.join(CT_FORMATS)}")
        try:
            scheme = QuantizationScheme.model_validate({k: v for k, v in group.items() if k != "format"})
        except Exception as e:
            raise CheckpointError(f"{path}: compressed-tensors group {name!r} is invalid ({one_line(e)})") from None
        out.append((list(scheme.targets), fmt, scheme))
    return out


def ct_scheme_for(schemes: list, module: str) -> tuple[str, Any] | None:
    """The (format, scheme) of the first group targeting `module` (a Linear), None when ignored or untargeted."""
    for targets, fmt, scheme in schemes:
        if any(_matches(t, module) for t in targets):
            return None if fmt is None else (fmt, scheme)
    return None


def _matches(target: str, module: str) -> bool:
    """compressed-tensors' target syntax: a class name (every projection read here is a Linear), ``re:`` and a
    regular expression, or a module name."""
    if target.startswith("re:"):
        return re.match(target[3:], module) is not None
    return target == "Linear" or target == module or module.endswith("." + target)


def dequantizing(source: TensorSource, qc: dict | None, path: Path) -> TensorSource:
    """`source` itself when unquantized, else it wrapped to dequantize on read."""
    return source if qc is None else DequantizingSource(source, qc, path)




__all__ = ["check_quantization", "declared_quantization", "dequantizing", "DequantizingSource", "fp8_dequantize",
           "QUANT_KEYS", "UNDERSTOOD"]
