"""Print the versions a CI run used: Python, the platform, and each package the results depend on."""

from __future__ import annotations

import platform
import sys
from importlib import metadata

PACKAGES = ("torch", "transformers", "numpy", "scipy", "dask", "distributed", "matplotlib", "gguf", "safetensors",
            "huggingface_hub", "tokenizers", "accelerate", "compressed-tensors", "typer", "rich", "hypothesis",
            "pytest", "qkinspect")


def lines() -> list[str]:
    out = [f"python {platform.python_version()} ({sys.executable})", f"platform {platform.platform()}"]
    for name in PACKAGES:
        try:
            out.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            out.append(f"{name} (not installed)")
    return out


if __name__ == "__main__":
    print("versions:", *lines(), sep="\n  ")
