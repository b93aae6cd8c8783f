"""What a checkpoint holds, before any analysis: its attention blocks, their shapes, positional schemes and flags,
the dtype and the bytes of its attention weights, all from the checkpoint's description and headers (no weight is
read). `qkinspect info` writes it (its table: `qkinspect.terminal.info`).

Example:
    >>> [b.key for b in model_info(None).blocks]  # the demo model  # doctest: +SKIP
    ['encoder']
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qkinspect.layer import ModelInfo


def model_info(model=None, *, revision: str | None = None) -> ModelInfo:
    """The description of `model` (anything `analyze` takes: a path, hub id, GGUF file, None for the demo model).

    Raises:
        InputError (and its subclasses): a model that cannot be opened, named."""
    from qkinspect.loading import opened

    with opened(model, revision) as m:
        return m.info
