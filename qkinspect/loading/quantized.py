"""Quantized safetensors checkpoints: which ``quantization_config`` qkinspect understands, and refusing the rest.

A quantized checkpoint stores integers or FP8 values plus scales; its raw values are not the model's weights (an FP8
block-quantized W_Q read without its ``weight_scale_inv`` is off by a factor of hundreds). So a config that declares
a quantization this module does not understand is refused where it enters, never read raw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qkinspect.errors import UnsupportedModelError

# Keys under which a config.json declares its quantization (compressed-tensors wrote ``compression_config`` before
# transformers adopted ``quantization_config``).
QUANT_KEYS = ("quantization_config", "compression_config")
UNDERSTOOD: dict[str, str] = {}  # quant_method -> what it is, for the message


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
        return qc
    what = f"quant_method {method!r}" if type(method) is str else "a quantization without a quant_method"
    supported = ", ".join(sorted(UNDERSTOOD)) or "none"
    raise UnsupportedModelError(
        f"{cfg_file}: {key} declares {what}, which qkinspect cannot dequantize (supported: {supported}); "
        f"its raw values are not the model's weights, so it is refused"
    )


__all__ = ["check_quantization", "declared_quantization", "QUANT_KEYS", "UNDERSTOOD"]
