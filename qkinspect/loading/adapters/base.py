"""The adapter contract: one small class per architecture family, mapping a checkpoint to AttentionLayers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from qkinspect.layer import AttentionLayer, BlockSpec

if TYPE_CHECKING:
    from torch import Tensor


class Adapter:
    """Maps one family's checkpoint tensors to the canonical layout of ARCHITECTURE.md §2.

    Subclasses set `model_types` and implement `blocks`, `tensor_names` and `build`. Names are the
    Hugging Face state-dict names *without* the base-model prefix (``bert.``, ``model.`` ...): the tensor source
    finds the prefix. `tensor_names` lets the loader read (and prefetch) exactly one layer's tensors.
    Optional tensors (biases, norms) are listed in `optional_names` and may be absent from `tensors`.
    """

    model_types: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: Any):
        self.config = config  # a transformers PretrainedConfig

    def blocks(self) -> list[BlockSpec]:
        raise NotImplementedError

    def tensor_names(self, block: str, layer: int) -> list[str]:
        """Required tensors for this layer."""
        raise NotImplementedError

    def optional_names(self, block: str, layer: int) -> list[str]:
        """Tensors used when present (biases, norms)."""
        return []

    def output_names(self, block: str, layer: int) -> list[str]:
        """Tensors (among the required and optional ones) that feed only W_O and b_O: the loader may skip reading
        them when no metric needs the output projection. [] (the default) means: read everything."""
        return []

    def expected_shapes(self, block: str, layer: int) -> dict[str, tuple[int, ...]]:
        """Shapes the config implies for required tensors; the loader checks them before `build`."""
        return {}

    def build(self, block: str, layer: int, tensors: Mapping[str, Tensor]) -> AttentionLayer:
        raise NotImplementedError

    def spec(self, block: str) -> BlockSpec:
        for b in self.blocks():
            if b.key == block:
                return b
        raise KeyError(block)


def heads_in(w: Tensor, n: int, d: int) -> Tensor:
    """nn.Linear weight (n*d, D) [out, in] -> (n, D, d): the named reshape for per-head row blocks."""
    out, D = w.shape
    assert out == n * d, f"expected {n}*{d}={n * d} output rows, got {out}"
    return w.reshape(n, d, D).transpose(1, 2)  # (n, d, D) -> (n, D, d)


def rows_of_heads(W: Tensor) -> Tensor:
    """(n, D, d) -> nn.Linear weight (n*d, D) [out, in]: the inverse of `heads_in` (the write-back's)."""
    n, D, d = W.shape
    return W.transpose(1, 2).reshape(n * d, D)  # (n, D, d) -> (n, d, D) -> (n*d, D)


def heads_out(w: Tensor, n: int, d: int) -> Tensor:
    """nn.Linear output-projection weight (D, n*d) [out, in] -> (n, d, D)."""
    D, inp = w.shape
    assert inp == n * d, f"expected {n}*{d}={n * d} input columns, got {inp}"
    return w.T.reshape(n, d, D)  # (n*d, D) -> (n, d, D)


def out_rows_of_heads(W_O: Tensor) -> Tensor:
    """(H, d, D) -> nn.Linear weight (D, H*d) [out, in]: the inverse of `heads_out` (the write-back's)."""
    H, d, D = W_O.shape
    return W_O.reshape(H * d, D).T  # (H*d, D) -> (D, H*d)


def bias_heads(b: Tensor | None, n: int, d: int) -> Tensor | None:
    """(n*d,) -> (n, d)."""
    return None if b is None else b.reshape(n, d)
