"""The tool's version, written into every document it saves (its own module, so that writing one imports nothing
above it: `qkinspect/__init__` is the package's face and sits on top)."""

__version__ = "0.1.0"
