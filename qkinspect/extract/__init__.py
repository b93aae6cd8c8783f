"""Extract: the canonical per-head tensors of a model to one safetensors file (`extract_heads`, in run.py), written
a layer at a time by a streaming safetensors writer (writer.py). Importing the package loads no torch."""

from __future__ import annotations


def __getattr__(name: str):
    if name == "extract_heads":
        from qkinspect.extract.run import extract_heads

        return extract_heads
    raise AttributeError(f"module 'qkinspect.extract' has no attribute {name!r}")
