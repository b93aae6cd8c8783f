"""An opened checkpoint: its identity, and its attention layers read one at a time."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from torch import Tensor

from qkinspect.errors import CheckpointError
from qkinspect.layer import AttentionLayer, ModelInfo
from qkinspect.loading.adapters.base import Adapter
from qkinspect.loading.resolve import Resolved


class LoadedModel:
    """Use as a context manager; `layers()` yields AttentionLayers, reading only one layer's tensors at a time."""

    def __init__(self, resolved: Resolved, adapter: Adapter):
        self.resolved = resolved
        self.adapter = adapter
        self.source = resolved.source
        blocks = tuple(adapter.blocks())
        self.info = ModelInfo(
            name=resolved.name,
            source=str(resolved.path),
            model_type=resolved.config.model_type,
            format=resolved.format,  # type: ignore[arg-type]
            blocks=blocks,
            revision=resolved.revision,
            architecture=(getattr(resolved.config, "architectures", None) or [None])[0],
        )

    def __enter__(self) -> LoadedModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.source.close()

    def plan(self, blocks: Iterable[str] | None = None, layers: Iterable[int] | None = None):
        """(block, layer) pairs to read, in file order."""
        want_blocks = set(blocks) if blocks is not None else None
        want_layers = set(layers) if layers is not None else None
        for b in self.info.blocks:
            if want_blocks is not None and b.key not in want_blocks:
                continue
            for i in range(b.n_layers):
                if want_layers is None or i in want_layers:
                    yield b.key, i

    def read_tensors(self, block: str, layer: int) -> dict[str, Tensor]:
        """Read and shape-check one layer's tensors (required and optional)."""
        a = self.adapter
        out: dict[str, Tensor] = {}
        shapes = a.expected_shapes(block, layer)
        for name in a.tensor_names(block, layer):
            t = self.source.get(name)
            if t is None:
                raise CheckpointError(f"{self.info.source}: tensor {name!r} is missing ({block} layer {layer})")
            want = shapes.get(name)
            if want is not None and tuple(t.shape) != tuple(want):
                raise CheckpointError(
                    f"{self.info.source}: tensor {name!r} has shape {tuple(t.shape)}, "
                    f"but the config implies {tuple(want)}"
                )
            out[name] = t
        for name in a.optional_names(block, layer):
            t = self.source.get(name)
            if t is not None:
                out[name] = t
        return out

    def layer(self, block: str, layer: int) -> AttentionLayer:
        return self.adapter.build(block, layer, self.read_tensors(block, layer))

    def layers(
        self, blocks: Iterable[str] | None = None, layers: Iterable[int] | None = None
    ) -> Iterator[AttentionLayer]:
        for block, i in list(self.plan(blocks, layers)):
            yield self.layer(block, i)
