"""Functions torch's CPU library exports (it links MKL's BLAS and LAPACK in), found by name: the ground floor under
the bf16 product route (`backend`) and the direct LAPACK calls (`lapack`). Imports nothing of qkinspect.

Example:
    >>> fn = torch_symbol("cblas_gemm_bf16bf16f32")  # a ctypes function, or None where torch's build lacks it
    >>> fn is None or callable(fn)
    True
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch


def torch_symbol(symbol: str):
    """A function exported by torch's CPU library (which links MKL's BLAS and LAPACK in), or None where absent."""
    lib = Path(torch.__file__).parent / "lib"
    for name in ("libtorch_cpu.so", "libtorch_cpu.dylib", "torch_cpu.dll"):
        try:
            return getattr(ctypes.CDLL(str(lib / name)), symbol)
        except (OSError, AttributeError):
            continue
    return None
